"""Of the ranks found ended in one look (``sensors.ranks``), the first named is the likeliest first cause:
the one killed by a signal of its own before one the launcher stopped with SIGTERM while tearing the rest
down, and any failure before a clean exit."""

from __future__ import annotations

import signal

from trainsup.sensors.ranks import Rank, RankEnd, _first_cause


def _end(rank: int, exit_code: int | None = None, sig: int | None = None) -> RankEnd:
    return RankEnd(Rank(100 + rank, rank, 0.0), exit_code, sig)


def test_the_killed_rank_comes_before_the_ranks_its_launcher_stopped() -> None:
    ends = [_end(0, sig=signal.SIGTERM), _end(1, sig=signal.SIGKILL), _end(2, exit_code=0), _end(3)]
    assert [e.rank.rank for e in sorted(ends, key=_first_cause)] == [1, 3, 0, 2]
    failed = [_end(0, exit_code=0), _end(1, exit_code=1), _end(2, sig=signal.SIGINT)]
    assert [e.rank.rank for e in sorted(failed, key=_first_cause)] == [1, 2, 0]
    assert _end(1, sig=signal.SIGKILL).says() == "rank 1 (pid 101) was killed by SIGKILL"
    assert _end(0, exit_code=1).failed and _end(0, exit_code=0).failed is False and _end(0).failed is None
