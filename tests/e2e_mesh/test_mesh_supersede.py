"""A supersede reaches every node that holds the cell it replaces, even one that was down.

Three ``hyphae up`` daemons on 127.0.0.1, A, B and C, one team. B's and C's agents place the
same beacon; A's agent stores a Decision that matches it, and both receive it. Then C stops,
and A's agent, over MCP, stores its correction with ``metadata.supersedes`` naming the first.
The correction's words do not match the beacon: it reaches B because B holds the cell it
replaces. On B the first cell reads ``status: superseded`` with its successor, recall and the
inbox show the correction and not the original. C comes back and converges the same way.
Refusals: a cell of another project's agent, and an id from another team, are refused with the
rule in the error.
"""

from __future__ import annotations

from .cluster import DEADLINE, Lab, MeshNode, wait_beacons_known, wait_connected, wait_until

INTEREST = "which message broker do the order services use"
ORIGINAL = "The order services use RabbitMQ as their message broker."
CORRECTION = "Reversed after the load test: Kafka replaces it, partitioned per tenant, from March on."


def cell(node: MeshNode, key: str, node_id: str) -> dict | None:
    response = node.http.get(f"/v1/cells/{node_id}", headers={"x-hyphae-key": key})
    return response.json() if response.status_code == 200 else None


def inbox(node: MeshNode, key: str) -> list[tuple[str, str, str | None]]:
    diffs = node.rest("GET", "/v1/inbox", key)["diffs"]
    return [(d["node_id"], d["kind"], d["related"]) for d in diffs]


def recalled(node: MeshNode, key: str) -> list[str]:
    return [hit["node_id"] for hit in node.rest("POST", "/v1/recall", key, json={"query": INTEREST, "k": 10})["results"]]


def converged(node: MeshNode, key: str, original: str, correction: str) -> bool:
    shown = cell(node, key, original)
    return bool(shown) and shown["superseded_by"] == correction and cell(node, key, correction) is not None


def test_a_supersede_reaches_every_holder_of_the_original_even_one_that_was_down(lab: Lab) -> None:
    a, b, c = lab.team(["a", "b", "c"], provider="hashed")
    lab.start_mesh([a, b, c])
    key = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in (a, b, c)}
    for node in (b, c):
        node.rest("POST", "/v1/beacons", key[node.name], json={"query": INTEREST}, expect=201)
    wait_beacons_known(a, 2)
    original = a.rest("POST", "/v1/cells", key["a"], json={"content": ORIGINAL, "cell_type": "Decision"},
                      expect=201)["node_id"]  # fmt: skip
    for node in (b, c):
        wait_until(lambda: cell(node, key[node.name], original), DEADLINE, message=f"the original at {node.name}")
        assert inbox(node, key[node.name]) == [(original, "match", None)]

    c.stop()
    correction = a.mcp(key["a"]).call(
        "store", {"content": CORRECTION, "cell_type": "Decision", "metadata": {"supersedes": [original]}}
    )["node_id"]

    for node in (a, b):
        wait_until(lambda: converged(node, key[node.name], original, correction), DEADLINE,
                   message=lambda: f"the supersede at {node.name}\n{node.log_tail()}")  # fmt: skip
    shown = cell(b, key["b"], original)
    assert (shown["status"], shown["superseded_by"], shown["content"]) == ("superseded", correction, ORIGINAL)
    assert cell(b, key["b"], correction)["supersedes"] == [original]
    assert inbox(b, key["b"]) == [(correction, "supersedes", original)]
    hits = recalled(b, key["b"])
    assert correction in hits and original not in hits

    c.start()  # no --peer: it finds the others from the control state it kept
    wait_connected([a, b, c])
    wait_until(lambda: converged(c, key["c"], original, correction), DEADLINE,
               message=lambda: f"the supersede at c after its restart\n{c.log_tail()}")  # fmt: skip
    assert inbox(c, key["c"]) == [(correction, "supersedes", original)]
    hits = recalled(c, key["c"])
    assert correction in hits and original not in hits


def test_who_may_supersede_is_enforced_with_the_rule_in_the_error(lab: Lab) -> None:
    (a,) = lab.team(["a"], provider="hashed")
    (other,) = lab.team(["other"], provider="hashed")
    a.start()
    other.start()
    shop_key = a.rest("POST", "/v1/admin/agents", admin=True, json={"name": "shop", "projects": ["shop"]},
                      expect=201)["api_key"]  # fmt: skip
    infra_key = a.rest("POST", "/v1/admin/agents", admin=True, json={"name": "infra", "projects": ["infra", "shop"]},
                       expect=201)["api_key"]  # fmt: skip
    foreign_key = other.add_agent("foreign")[0]
    shop_cell = a.rest("POST", "/v1/cells", shop_key, json={"content": ORIGINAL, "cell_type": "Decision",
                                                             "project": "shop"}, expect=201)["node_id"]  # fmt: skip
    foreign = other.rest("POST", "/v1/cells", foreign_key, json={"content": ORIGINAL, "cell_type": "Decision"},
                         expect=201)["node_id"]  # fmt: skip

    response = a.http.post("/v1/cells", headers={"x-hyphae-key": infra_key}, json={
        "content": CORRECTION, "cell_type": "Decision", "project": "infra", "metadata": {"supersedes": [shop_cell]},
    })  # fmt: skip
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["field"] == "metadata.supersedes" and "only its author, or a cell of the same project" in error["message"]

    response = a.http.post("/v1/cells", headers={"x-hyphae-key": shop_key}, json={
        "content": CORRECTION, "cell_type": "Decision", "project": "shop", "metadata": {"supersedes": [foreign]},
    })  # fmt: skip
    assert response.status_code == 404, response.text
    assert foreign in response.json()["error"]["message"]
    assert cell(a, shop_key, shop_cell)["status"] == "active"
