//! The README's snippets: every service configuration loads and decides as the README says; the
//! Envoy configuration is YAML that names the service's cluster, and HTTP/2 for it.

use super::*;

fn blocks(marker: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut out = Vec::new();
    let mut rest = readme.as_str();
    while let Some(at) = rest.find(marker) {
        rest = &rest[at + marker.len()..];
        let start = rest.find("```yaml\n").unwrap() + "```yaml\n".len();
        let end = rest[start..].find("```").unwrap();
        out.push(rest[start..start + end].to_owned());
        rest = &rest[start + end..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_configurations_load_and_decide() {
    let configs = blocks("<!-- rls-config -->");
    assert_eq!(configs.len(), 2);
    let files: Vec<(String, String)> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("readme{i}.yaml"), c.clone()))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let mut rls = Rls::start(&refs, &[]).await;
    let mut con = rls.redis.client();
    let _: () = redis::cmd("RATELIMIT.POLICY")
        .arg(&["SET", "tenant-default", "sliding-window", "10000", "1h"][..])
        .query(&mut con)
        .unwrap();
    // The extension's example: a token bucket of 100 a minute, burst 20.
    let r = rls
        .call(request(
            "api",
            vec![
                descriptor(&[("user", "u1")]),
                descriptor(&[("tenant", "t1")]),
            ],
        ))
        .await;
    assert_eq!(codes(&r), vec![OK, OK]);
    assert_eq!(r.statuses[0].limit_remaining, 19);
    // The Envoy example: both descriptors at once, ten a second per address.
    fresh_window(1, Duration::from_millis(950)).await;
    let both = || {
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "192.0.2.1")]),
                descriptor(&[("user", "alice")]),
            ],
        )
    };
    let mut ten = both();
    ten.hits_addend = 10;
    assert_eq!(rls.call(ten).await.overall_code, OK);
    let r = rls.call(both()).await;
    assert_eq!(codes(&r), vec![OVER, OK]);
    assert_eq!(
        r.statuses[1].limit_remaining, 90,
        "the refused request took nothing from alice"
    );
}

/// docs/gateways.md shows the README's service configurations word for word, so the page's YAML
/// is what the test above loads.
#[test]
fn the_docs_page_shows_the_tested_configurations() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/gateways.md"
    ))
    .unwrap();
    for config in blocks("<!-- rls-config -->") {
        assert!(
            page.contains(&format!("```yaml\n{config}```")),
            "docs/gateways.md must show this configuration of the README as it is:\n{config}"
        );
    }
}

#[test]
fn the_readme_envoy_configuration_names_the_service() {
    let envoy = blocks("<!-- envoy-config -->");
    assert_eq!(envoy.len(), 1);
    let yaml: serde_json::Value = serde_saphyr::from_str(&envoy[0]).unwrap();
    let text = serde_json::to_string(&yaml).unwrap();
    for needle in [
        "envoy.filters.http.ratelimit",
        "\"cluster_name\":\"ratelimit\"",
        "\"transport_api_version\":\"V3\"",
        "http2_protocol_options",
        "\"port_value\":8081",
        "\"descriptor_key\":\"user\"",
        "\"remote_address\":{}",
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
}
