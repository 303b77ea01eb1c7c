"""Schemathesis hooks of vcp's contract test (orchestrator/tests/contract.rs).

Two things the document cannot say, and nothing else:

- `POST /v1/tenants` provisions for real: the server under test runs a reconcile worker, so
  a tenant the run creates gets a namespace, certificates and etcd on the dev cluster.
  `after_call` bounds that: each new tenant deletes the one before it. The Rust test deletes
  the last one and waits for them all to be gone.
- `GET /v1/tenants/{name}/usage` refuses a range whose `since` is after its `until`, a rule
  between two parameters that no JSON Schema states. `filter_query` leaves such ranges out.
"""

import json
import os
from datetime import datetime, timezone
from urllib.parse import quote

import requests
import schemathesis

URL = os.environ["VCP_CONTRACT_URL"]
TOKEN = os.environ["VCP_CONTRACT_TOKEN"]


# Tenants the run created and has not deleted yet, oldest first.
_created = []


@schemathesis.hook
def after_call(context, case, response):
    """Each tenant the run creates deletes the one before it: the newest stays for the
    requests that follow its creation (schemathesis reads what it created), and the dev
    cluster holds one generated tenant being provisioned and the ones being torn down,
    however many examples run."""
    if case.method.upper() != "POST" or case.path != "/v1/tenants" or response.status_code != 201:
        return
    created = json.loads(response.content)
    # With its owner: names are unique per owner only, and the run's admin token sees the
    # test's own fixture tenant too, which a generated name may repeat.
    _created.append((created["name"], created["owner"]))
    while len(_created) > 1:
        name, owner = _created.pop(0)
        r = requests.delete(
            f"{URL}/v1/tenants/{quote(name, safe='')}?owner={quote(owner, safe='')}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        # 404: a generated request deleted it first.
        if r.status_code not in (202, 404):
            raise RuntimeError(f"cleanup: DELETE /v1/tenants/{name} answered {r.status_code}: {r.text}")


def _time(value):
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None


@schemathesis.hook
def filter_query(context, query):
    """`GET /v1/tenants/{name}/usage` refuses (422) a range whose `since` is after its `until`
    (given, or now). Such ranges are left out; api.rs tests that they are refused."""
    if context.operation is None or context.operation.path != "/v1/tenants/{name}/usage":
        return True
    if not isinstance(query, dict) or not isinstance(query.get("since"), str):
        return True
    since = _time(query["since"])
    until = _time(query["until"]) if isinstance(query.get("until"), str) else datetime.now(timezone.utc)
    if since is None or until is None or since.tzinfo is None or until.tzinfo is None:
        return True
    return since <= until
