"""How far ahead an object store is read: sized from simulated answers (`outcore.storage.pace`)."""

from __future__ import annotations

import pytest

from outcore.storage.pace import BYTES_AHEAD, MAX_AHEAD, MIN_AHEAD, START_AHEAD, Pace

MB = 1_000_000


def _rounds(pace: Pace, latency: float, bandwidth: float, slot: int, rounds: int) -> list[int]:
    """A closed loop: each round asks for as many slots as ``pace`` says, at once, over a link of this
    latency and bandwidth (shared by the round's requests); the depths it said, round by round."""
    now, depths = 0.0, []
    for _ in range(rounds):
        depth = pace.ahead(slot)
        depths.append(depth)
        answered = now + latency + depth * slot / bandwidth
        for _ in range(depth):
            pace.took(now, answered, slot)
        now = answered
    return depths


def test_a_link_held_back_by_its_latency_gets_deeper_until_the_bound():
    depths = _rounds(Pace(), latency=0.05, bandwidth=10_000 * MB, slot=MB, rounds=12)
    assert depths[0] == START_AHEAD
    assert depths == sorted(depths) and depths[-1] == MAX_AHEAD  # 50 ms at 10 GB/s: 500 slots would fill it
    assert depths[1] == 2 * depths[0]  # the rate grows with the depth, and the depth with the rate
    assert depths.index(MAX_AHEAD) <= 9  # within half a second


def test_a_busy_link_is_not_made_deeper_than_what_it_delivers_in_a_request_time():
    # 5 ms at 100 MB/s: the start's 8 slots already fill the link, each answer then taking 85 ms
    depths = _rounds(Pace(), latency=0.005, bandwidth=100 * MB, slot=MB, rounds=30)
    assert depths[-1] == depths[-10]  # steady
    assert depths[-1] <= 2 * 100 * 0.085 + 1  # GAIN x rate x fastest request time, in slots


def test_a_steady_consumer_gets_its_own_rate_times_the_request_time():
    pace = Pace()
    for i in range(400):  # a slot read every 5 ms (200 MB/s), each request taking 20 ms
        pace.took(i * 0.005, i * 0.005 + 0.02, MB)
    assert 7 <= pace.ahead(MB) <= 9  # 2 x 200 MB/s x 20 ms / 1 MB = 8


def test_the_depth_stays_within_its_bounds():
    pace = Pace()
    assert pace.ahead(MB) == START_AHEAD  # nothing measured yet
    for i in range(64):  # fast answers, tiny slots: as few as hide the latency, never fewer than MIN_AHEAD
        pace.took(i * 0.01, i * 0.01 + 0.0001, 100)
    assert pace.ahead(100) == MIN_AHEAD
    for i in range(64):  # 1 s each, huge rate
        pace.took(1 + i * 0.001, 2 + i * 0.001, 64 * MB)
    assert pace.ahead(64 * MB) == BYTES_AHEAD // (64 * MB)  # bytes fetched ahead wait in memory: bounded
    assert pace.ahead(MB, budget=BYTES_AHEAD // 8) == BYTES_AHEAD // 8 // MB  # a DataLoader worker of 8
    assert pace.ahead(1) == MAX_AHEAD


@pytest.mark.parametrize("slot", [0, 1])
def test_empty_slots_are_asked_for_with_the_start_depth(slot):
    assert Pace().ahead(slot) == START_AHEAD
