// Sends HTTP requests to an example app with Node's own fetch and prints what came back, as JSON:
// the Express example's driver, as drive.py (httpx) is the FastAPI example's.
//
// usage: node drive.mjs BASE_URL PLAN
//   PLAN: a JSON list of rounds, each a list of requests {"method", "path", "key", "json"} sent at
//   once (concurrently); the rounds one after the other. Prints a list of rounds of responses
//   {"status", "headers" (lowercased names), "body" (JSON if it parses, else text)}.

const [baseUrl, planText] = process.argv.slice(2);

async function send(request) {
  const headers = {};
  if (request.key) headers["X-API-Key"] = request.key;
  let body;
  if (request.json !== undefined && request.json !== null) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(request.json);
  }
  const response = await fetch(new URL(request.path ?? "/", baseUrl), {
    method: request.method ?? "GET",
    headers,
    body,
    signal: AbortSignal.timeout(20_000),
  });
  const text = await response.text();
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return {
    status: response.status,
    headers: Object.fromEntries([...response.headers].map(([k, v]) => [k.toLowerCase(), v])),
    body: parsed,
  };
}

const rounds = [];
for (const requests of JSON.parse(planText)) {
  rounds.push(await Promise.all(requests.map(send)));
}
console.log(JSON.stringify(rounds));
