"""What binding each frame to its sender costs (protocol 2, ``mesh.frame_auth``), per frame.

Two parts:

* **primitives**: sealing and opening under the team key (all protocol 1 did), the pair tag
  at each end (what protocol 2 adds), an Ed25519 signature and its check (the alternative not
  taken), and deriving one pair key (once per peer);
* **engine**: CPU per frame through the real engine, one member sending a PING and another
  admitting it (and sending its PONG), with the real crypto and the simulator's ``sim`` crypto.
  This part uses only what the engine has always offered, so the same script measures a tree
  from before the change too (``PYTHONPATH=/path/to/base``); the primitives part needs protocol 2.

Run by hand (CPU time, best of several repeats; a shared machine moves the figures, not much
their ratios)::

    python benchmarks/frame_auth_cost.py [--engine-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mesh.events import FrameReceived, PeerDiscovered  # noqa: E402
from mesh.identity import NodeIdentity  # noqa: E402
from mesh.team import Team  # noqa: E402
from mesh.testing import VirtualNetwork, make_engine  # noqa: E402
from mesh.wire import MsgType  # noqa: E402
from node.energy import EnergyModel  # noqa: E402


def per_call_us(fn, number: int, repeat: int = 5) -> float:
    """The best of ``repeat`` runs of ``number`` calls, in CPU µs per call."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, time.process_time() - started)
    return best / number * 1e6


def primitives(payload_bytes: int) -> list[tuple[str, float]]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from mesh.frame_auth import SenderBinding
    from mesh.team import AUTH_SIGNED, FrameAuth

    team = Team.create()
    sealer, alice, bob = team.sealer(), NodeIdentity.generate(), NodeIdentity.generate()
    plain = os.urandom(payload_bytes)
    salt = team.pair_key_salt()
    binding_a = SenderBinding(alice.node_id, sign=alice.sign, verify=NodeIdentity.verify, agree=alice.agree, salt=salt)
    binding_b = SenderBinding(bob.node_id, sign=bob.sign, verify=NodeIdentity.verify, agree=bob.agree, salt=salt)
    pair = binding_a.auth_for(bob.node_id, bob.public_key)
    untagged = sealer.seal(alice.node_id, plain)
    tagged = sealer.seal(alice.node_id, plain, pair)
    signed = sealer.seal(alice.node_id, plain, FrameAuth(AUTH_SIGNED, alice.sign))
    opened_pair, opened_signed = sealer.unseal(tagged), sealer.unseal(signed)
    assert binding_b.vouches(opened_pair, alice.public_key) and binding_b.vouches(opened_signed, alice.public_key)
    key = Ed25519PublicKey.from_public_bytes(alice.public_key)
    fresh = iter(range(10**9))

    def derive() -> None:  # a pair key for a peer not seen before
        SenderBinding(alice.node_id, sign=alice.sign, verify=NodeIdentity.verify, agree=alice.agree,
                      salt=salt).auth_for(bob.node_id, bob.public_key)  # fmt: skip
        next(fresh)

    n = 20_000
    check_signature = lambda: key.verify(opened_signed.tag, bytes(opened_signed.covered))  # noqa: E731
    signed_frame = lambda: binding_b.vouches(opened_signed, alice.public_key)  # noqa: E731
    return [
        ("seal under the team key (protocol 1)", per_call_us(lambda: sealer.seal(alice.node_id, plain), n)),
        ("open under the team key (protocol 1)", per_call_us(lambda: sealer.unseal(untagged), n)),
        ("pair tag, sending (keyed BLAKE2b-128)", per_call_us(lambda: pair.tag(untagged), n)),
        ("pair tag, checking", per_call_us(lambda: binding_b.vouches(opened_pair, alice.public_key), n)),
        ("Ed25519 signature of a frame (not taken)", per_call_us(lambda: alice.sign(untagged), 2000)),
        ("Ed25519 check of a frame (not taken)", per_call_us(check_signature, 2000)),
        ("signed frame checked (first contact only)", per_call_us(signed_frame, 2000)),
        ("pair key derived (once per peer: X25519)", per_call_us(derive, 500)),
    ]


def engine_per_frame(fast: bool, frames: int = 4000) -> tuple[float, float]:
    """CPU µs for b to send a PING to a, and for a to admit it (and answer its PONG)."""
    team, energy = Team.create(), EnergyModel()
    net = VirtualNetwork(seed=1)
    for name in ("a", "b"):
        net.add(make_engine(name, team, energy, seed=1, fast=fast))
    net.start()
    net.inject("b", PeerDiscovered("a"))
    net.run_for(3000)
    a, b = net.hosts["a"].engine, net.hosts["b"].engine
    assert len(a.peers) == 1 and len(b.peers) == 1
    now, state = net.now, b.state
    sent: list[bytes] = []

    def send() -> None:
        state.now, state.out = now, []
        state.send("a", MsgType.PING, nonce=len(sent) + 1)
        sent.append(state.out[0].frame)

    send_us = per_call_us(send, frames, repeat=1)
    before = dict(a.counters.drops)
    queue = iter(sent)
    admit_us = per_call_us(lambda: a.handle(FrameReceived("b", next(queue)), now), frames, repeat=1)
    assert dict(a.counters.drops) == before, a.counters.drops  # every frame let in
    return send_us, admit_us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-only", action="store_true",
                   help="the engine part alone (it runs on a tree from before the change too)")  # fmt: skip
    p.add_argument("--payload", type=int, default=300, help="plaintext bytes of the primitives' frame")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    if not args.engine_only:
        print(f"\nprimitives, a {args.payload}-byte frame: CPU µs per call")
        for what, us in primitives(args.payload):
            print(f"  {what:<45} {us:8.1f}")
    print("\nengine, a PING from b admitted by a (which answers a PONG): CPU µs per frame, best of 3")
    for fast in (False, True):
        runs = [engine_per_frame(fast) for _ in range(3)]
        send_us, admit_us = min(r[0] for r in runs), min(r[1] for r in runs)
        print(f"  {'sim' if fast else 'real'} crypto: send {send_us:6.1f}   admit + answer {admit_us:6.1f}")


if __name__ == "__main__":
    main()
