"""Sends HTTP requests to an example app with httpx and prints what came back, as JSON.

usage: drive.py BASE_URL PLAN
  PLAN: a JSON list of rounds, each a list of requests {"method", "path", "key", "json"} sent at
  once (concurrently); the rounds one after the other. Prints a list of rounds of responses
  {"status", "headers" (lowercased names), "body" (JSON if it parses, else text)}.
Run by tests/integration/examples.rs with the FastAPI example's virtualenv (httpx is there).
"""

import asyncio
import json
import sys

import httpx


async def send(client, request):
    headers = {"X-API-Key": request["key"]} if request.get("key") else {}
    response = await client.request(
        request.get("method", "GET"), request.get("path", "/"), headers=headers, json=request.get("json")
    )
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return {"status": response.status_code, "headers": dict(response.headers), "body": body}


async def main(base_url, plan):
    rounds = []
    async with httpx.AsyncClient(base_url=base_url, timeout=20) as client:
        for requests in plan:
            rounds.append(await asyncio.gather(*(send(client, r) for r in requests)))
    print(json.dumps(rounds))


asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
