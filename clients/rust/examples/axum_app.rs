use redis_ratelimit_client::{tower::RateLimitLayer, Algorithm, Limit, Options, RateLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = redis::Client::open(std::env::var("REDIS_URL")?)?;
    let limiter = RateLimiter::new(redis.get_connection_manager().await?, Options::default())?;
    let limit = Limit::new(Algorithm::SlidingWindow, 100, "1m")?;
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello\n" }));
    let app = app.layer(RateLimitLayer::new(limiter, limit)); // per x-api-key, else per IP
    let listener = tokio::net::TcpListener::bind(std::env::var("ADDR")?).await?;
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    Ok(axum::serve(listener, app).await?)
}
