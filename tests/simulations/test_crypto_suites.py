"""``--crypto sim|real``: the simulator's cheap suite keeps the sizes and the checks of the real one."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from mesh.events import FrameReceived, SendFrame, Started
from mesh.identity import NodeIdentity
from mesh.team import AUTH_PAIR, AUTH_SIGNED, FRAME_OVERHEAD, SENDER_TAG_BYTES, FrameSealer, Team
from mesh.testing import sealed_by
from mesh.wire import BeaconPayload, decode_envelope
from node.energy import EnergyModel
from simulations.network import LinkModel, SimNetwork
from simulations.runner import RunConfig, run

TEAM = Team("simulation", hashlib.blake2b(b"team", digest_size=32).digest())
BEACON = BeaconPayload("b1", "t", "agent", "q", 0.8, embedding=np.full(4, 0.5, np.float32))


def _two_nodes(crypto: str) -> tuple[SimNetwork, list[bytes]]:
    """n0 places a beacon, n1 is told about n0; after 3 s n1 holds the beacon. Returns every frame sent."""
    net = SimNetwork(LinkModel(2), seed=1, team=TEAM, energy=EnergyModel(), crypto=crypto, view="full")
    frames: list[bytes] = []
    net.on_effect = lambda host, effect: frames.append(effect.frame) if isinstance(effect, SendFrame) else None
    for addr in ("n0", "n1"):
        net.add(net.build(addr))
    net.own_beacons["n0"] = [BEACON]
    net.seeds["n1"] = ["n0"]
    for addr in ("n0", "n1"):
        net.boot(addr)
    net.run_for(3_000)
    assert len(net.hosts["n1"].engine.beacons) == 1  # every frame opened, every diff verified
    return net, frames


def _signed_beacon(net: SimNetwork):
    return next(d for d in net.hosts["n0"].engine.control.entries(net.hosts["n0"].node_id) if d.payload == BEACON)


@pytest.mark.parametrize("crypto", ["sim", "real"])
def test_both_suites_have_the_wire_sizes_of_the_real_one(crypto):
    net, frames = _two_nodes(crypto)
    assert len(_signed_beacon(net).signature) == 64  # an Ed25519 signature's size
    opener = net.opener()
    tags = [opener.unseal(frame).auth for frame in frames]
    for frame, auth in zip(frames, tags):
        # header, a 16-byte AEAD tag and the sender tag: 16 bytes (pair key) or 64 (a signature)
        assert len(frame) == len(opener.open(frame)[2]) + FRAME_OVERHEAD - 16 + SENDER_TAG_BYTES[auth]
    assert tags.count(AUTH_SIGNED) == 1 and set(tags) == {AUTH_PAIR, AUTH_SIGNED}  # signed: n1's first word only


def test_real_suite_is_ed25519_and_chacha20():
    net, frames = _two_nodes("real")
    assert isinstance(net.opener(), FrameSealer)
    for frame in frames:
        FrameSealer(TEAM.frame_key()).open(frame)  # each opens under the team's real frame key
    diff = _signed_beacon(net)
    assert NodeIdentity.verify(net.hosts["n0"].engine.public_key, diff.signature, diff.signed)
    assert net.build("n0").node_id == net.hosts["n0"].node_id  # a restart keeps its identity


@pytest.mark.parametrize("crypto", ["sim", "real"])
def test_both_suites_reject_tampering(crypto):
    net, frames = _two_nodes(crypto)
    opener = net.opener()
    carrier = next(f for f in frames if decode_envelope(opener.open(f)[2]).diffs)
    fresh = net.build("n2")
    fresh.handle(Started(), net.now)
    flipped = carrier[:-20] + bytes([carrier[-20] ^ 1]) + carrier[-19:]
    fresh.handle(FrameReceived("n0", flipped), net.now)
    assert fresh.counters.drops["decrypt_failed"] == 1
    # A diff whose signature does not check out, in a well-sealed frame: refused by the engine.
    sender, _, plain = opener.open(carrier)
    env = decode_envelope(plain)
    bad = tuple(dataclasses.replace(d, signature=bytes(64)) for d in env.diffs)
    forged = dataclasses.replace(env, diffs=bad, sent_at=net.now)
    n0 = net.hosts["n0"].engine
    assert sender == n0.node_id
    fresh.handle(FrameReceived("n0", sealed_by(n0, forged, to=fresh)), net.now)
    assert fresh.counters.drops["bad_signature"] >= 1 and len(fresh.beacons) == 0


def test_a_run_states_its_suite_and_real_crypto_delivers_the_same():
    base = dict(nodes=6, stores=6, seed=7, strategies=("hyphae",), dim=16, topics=3, beacons_per_node=1,
                drain_ms=5000)  # fmt: skip
    sim, real = run(RunConfig(**base)).summary, run(RunConfig(crypto="real", **base)).summary
    assert sim["config"]["crypto"] == "sim" and real["config"]["crypto"] == "real"
    for key in ("delivery_ratio", "precision", "messages_per_store", "interested_mean"):
        assert real["strategies"]["hyphae"][key] == sim["strategies"]["hyphae"][key]
    # Same sizes on the wire: bytes per store differ only by the (random) contents, not the lengths.
    assert real["strategies"]["hyphae"]["bytes_per_store"] == sim["strategies"]["hyphae"]["bytes_per_store"]


def test_unknown_suite_is_refused():
    with pytest.raises(ValueError, match="crypto"):
        RunConfig(crypto="none")
