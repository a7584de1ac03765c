"""The ranks under a launcher (``sensors.ranks``), with real processes: found with their rank numbers (a
data-loader worker is not a rank), and a rank killed while the launcher lives on makes the engine stop
the whole tree within seconds, journaled with the rank, the attempt ending as that rank did.

The launcher here is a stand-in that never notices its children's end (as ranks blocked in a collective
keep a real launcher waiting): what trainsup does must not depend on the launcher. It is started as
``torchrun`` (a link to Python under that name), as a user's command names it. The real launchers are
the real tiers' (tests/real_ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.conftest import diagnose_json
from trainsup.record.journal import read_events
from trainsup.run.engine import Supervisor
from trainsup.run.policy import parse_policy
from trainsup.run.spec import RunSpec
from trainsup.sensors.ranks import RankWatch, find_ranks, is_launcher

# Two ranks (RANK, LOCAL_RANK, as torchrun sets them), each with a worker that inherits its environment;
# the launcher waits forever, whatever happens to them. Rank 0 holds the read end of a pipe whose write end
# only rank 1 holds: when rank 1 dies, rank 0 at once fails as gloo's ranks do on losing a peer (a
# traceback, exit 1), well before trainsup's second of grace is up.
LAUNCHER = """
import os, subprocess, sys, time
rank_code = '''
import os, subprocess, sys, threading, time
subprocess.Popen([os.environ["RANK_PYTHON"], "-c", "import time; time.sleep(600)"])  # a data-loader worker
def lose_peer(fd):
    os.read(fd, 1)  # end of file: rank 1 is gone
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "/runs/train.py", line 41, in <module>', file=sys.stderr)
    print("    dist.all_reduce(loss)", file=sys.stderr)
    print("RuntimeError: [/src/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41097",
          file=sys.stderr, flush=True)
    os._exit(1)
if os.environ["RANK"] == "0":
    threading.Thread(target=lose_peer, args=(int(os.environ["PEER_FD"]),), daemon=True).start()
for step in range(1, 100000):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    time.sleep(0.2)
'''
peer_read, peer_write = os.pipe()
for rank, fd in ((0, peer_read), (1, peer_write)):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", PEER_FD=str(fd))
    subprocess.Popen([os.environ["RANK_PYTHON"], "-c", rank_code], env=env, pass_fds=(fd,))
os.close(peer_read)
os.close(peer_write)
time.sleep(600)
"""


# The ranks run under Python's own name (a process started through the link would be named torchrun,
# and its sys.executable would be the link).
RANK_ENV = {"RANK_PYTHON": sys.executable}


def _torchrun(tmp: Path) -> Path:
    link = tmp / "torchrun"
    link.symlink_to(sys.executable)
    return link


def _ranks(root: int, launcher: bool, want: int) -> list[tuple[int | None, int]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = find_ranks(root, launcher)
        if len(found) >= want:
            return [(r.rank, r.pid) for r in found]
        time.sleep(0.1)
    raise AssertionError(f"ranks not found under {root}")


def test_ranks_are_found_by_their_environment_and_a_worker_is_not_one(tmp_path: Path) -> None:
    launcher = psutil.Popen([str(_torchrun(tmp_path)), "-c", LAUNCHER], start_new_session=True,
                            stdout=subprocess.DEVNULL, env={**os.environ, **RANK_ENV})
    try:
        assert is_launcher([str(tmp_path / "torchrun"), "--nproc_per_node", "2", "train.py"])
        assert is_launcher(["python", "-m", "torch.distributed.run", "train.py"])
        assert not is_launcher(["python", "train.py"])
        found = _ranks(launcher.pid, True, 2)
        time.sleep(1.0)  # the workers have started by now: still two ranks
        found = [(r.rank, r.pid) for r in find_ranks(launcher.pid, True)]
        assert [rank for rank, _ in found] == [0, 1]
        assert all(psutil.Process(pid).ppid() == launcher.pid for _, pid in found)
        watch = RankWatch(launcher.pid, True, rescan_s=0.0)
        assert watch.poll(0.0)[1] and [r.rank for r in watch.ranks] == [0, 1]
        os.kill(found[1][1], signal.SIGKILL)
        deadline = time.monotonic() + 5
        ends = []
        while not ends and time.monotonic() < deadline:
            ends = watch.poll(time.monotonic())[0]
            time.sleep(0.05)
        end = ends[0]  # rank 0 may have failed for its lost peer in the same poll: rank 1 is the first
        # never reaped by this launcher: a zombie whose status says how it ended
        assert (end.rank.rank, end.signal, end.failed) == (1, signal.SIGKILL, True)
        assert end.says() == f"rank 1 (pid {found[1][1]}) was killed by SIGKILL"
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


# A launcher whose ranks stay a while between fork and exec (as under load): until the exec, a child shows
# the launcher's environment, with no rank in it. Each rank then starts a data-loader worker.
SLOW_EXEC_LAUNCHER = """
import os, sys, time
rank_code = ("import subprocess, sys, time; "
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
for rank in (0, 1):
    if os.fork() == 0:
        time.sleep(1.5)
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
        os.execve(os.environ["RANK_PYTHON"], [os.environ["RANK_PYTHON"], "-c", rank_code], env)
time.sleep(600)
"""


def test_a_rank_read_between_its_fork_and_exec_is_read_again_once_it_runs(tmp_path: Path) -> None:
    launcher = psutil.Popen([str(_torchrun(tmp_path)), "-c", SLOW_EXEC_LAUNCHER], start_new_session=True,
                            stdout=subprocess.DEVNULL, env={**os.environ, **RANK_ENV})
    try:
        watch = RankWatch(launcher.pid, True, rescan_s=0.0)
        deadline, seen_before_exec = time.monotonic() + 20, False
        while time.monotonic() < deadline:
            watch.poll(time.monotonic())
            children = launcher.children()
            seen_before_exec = seen_before_exec or (len(children) == 2 and bool(watch.ranks))
            if sorted(r.rank for r in watch.ranks if r.rank is not None) == [0, 1] and \
                    all(len(psutil.Process(r.pid).children()) == 1 for r in watch.ranks):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        watch.poll(time.monotonic())
        assert seen_before_exec, "the forked children were never read before their exec"
        # the two ranks by their numbers, each the launcher's child; no guess, no worker among them
        assert [(r.rank, psutil.Process(r.pid).ppid()) for r in watch.ranks] == [(0, launcher.pid), (1, launcher.pid)]
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()


def test_a_rank_killed_under_a_launcher_that_waits_on_stops_the_whole_tree_within_seconds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", LAUNCHER), tmp_path, run_dir, {**os.environ, **RANK_ENV}, False,
                   None)
    sup = Supervisor(spec, parse_policy("restart:\n  max: 0\nstop:\n  grace_s: 5\n", "policy.yaml"))
    killed: dict[str, float | int] = {}

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = read_events(run_dir) if (run_dir / "events.jsonl").exists() else []
            found = [e for e in events if e["event"] == "ranks"]
            if found and len(found[-1]["ranks"]) == 2:
                pid = next(r["pid"] for r in found[-1]["ranks"] if r["rank"] == 1)
                killed["pid"], killed["tree"] = pid, len(psutil.Process(sup_child()).children(recursive=True))
                killed["at"] = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    def sup_child() -> int:
        return int(sup.reactions.child_pid or 0)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    code = sup.run()
    ended = time.monotonic()
    killer.join()
    assert "at" in killed, "rank 1 was never found"
    took = ended - float(killed["at"])
    print(f"rank 1 killed -> the tree stopped and the run ended in {took:.2f} s")
    assert took < 20, took  # seconds, where the launcher itself would have waited its 600 s (the figure: real tier)
    assert code != 0
    events = read_events(run_dir)
    (ranks,) = [e for e in events if e["event"] == "ranks"][-1:]
    assert [r["rank"] for r in ranks["ranks"]] == [0, 1]
    rank_end = next(e for e in events if e["event"] == "rank_ended")  # rank 0's exit 1 may follow
    assert (rank_end["rank"], rank_end["pid"], rank_end["signal"]) == (1, killed["pid"], signal.SIGKILL)
    (attempt_end,) = [e for e in events if e["event"] == "attempt_end"]
    assert attempt_end["rank_ended"] == 1 and attempt_end["child_signal"] == signal.SIGKILL
    # rank 0's traceback for its lost peer is in the log, and gives way to the kill that caused it
    assert "Connection closed by peer" in (run_dir / "attempt-1.log").read_text()
    assert [e["class"] for e in events if e["event"] == "fault"] == ["host_oom_killed"]
    offline = diagnose_json(run_dir / "attempt-1.log")
    assert offline["fault"] == "host_oom_killed" and "rank 1" in offline["evidence"], offline
    assert int(killed["tree"]) == 4  # the launcher's two ranks and their workers were there
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and "rank_code" in
                " ".join(p.info["cmdline"])]


# Rank 0 waits in a collective (a function of a file named as torch's, so that its frame reads as one);
# rank 1 is stopped by the test, as a SIGSTOPped (or swapped-out, or debugged) rank would be.
COLLECTIVE = "import time\n\n\ndef all_reduce():\n    time.sleep(600)\n"
HUNG_LAUNCHER = """
import os, subprocess, sys, time
rank_code = '''
import os, sys, time
sys.path.insert(0, os.environ["COLLECTIVES"])
import distributed_c10d
for step in range(1, 4):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    time.sleep(0.2)
if os.environ["RANK"] == "0":
    distributed_c10d.all_reduce()
while True:
    time.sleep(0.1)
'''
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    subprocess.Popen([os.environ["RANK_PYTHON"], "-c", rank_code], env=env)
time.sleep(600)
"""


def _gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_hang_across_ranks_names_the_stopped_rank_as_the_straggler(tmp_path: Path) -> None:
    (tmp_path / "c10d").mkdir()
    (tmp_path / "c10d" / "distributed_c10d.py").write_text(COLLECTIVE)
    run_dir = tmp_path / "run"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", HUNG_LAUNCHER), tmp_path, run_dir,
                   {**os.environ, "COLLECTIVES": str(tmp_path / "c10d"), **RANK_ENV}, False, None)
    sup = Supervisor(spec, parse_policy("restart:\n  max: 0\nstop:\n  grace_s: 2\nhang:\n  timeout_s: 4\n",
                                        "policy.yaml"))
    stopped: dict[str, int] = {}

    def stop_rank_1() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events = read_events(run_dir) if (run_dir / "events.jsonl").exists() else []
            found = [e for e in events if e["event"] == "ranks"]
            if found and len(found[-1]["ranks"]) == 2:
                time.sleep(1.0)  # past its three steps
                stopped["pid"] = next(r["pid"] for r in found[-1]["ranks"] if r["rank"] == 1)
                os.kill(stopped["pid"], signal.SIGSTOP)
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_rank_1, daemon=True)
    stopper.start()
    sup.run()
    stopper.join()
    assert "pid" in stopped
    events = read_events(run_dir)
    assert [e["class"] for e in events if e["event"] == "fault"] == ["hang"]
    (stacks,) = [e for e in events if e["event"] == "hang_stacks"]
    assert stacks["stragglers"] == [1]
    report = Path(stacks["path"]).read_text()
    assert "ranks: rank 0 in all_reduce, rank 1 stopped: rank 1 is the straggler" in report
    assert _gone_or_zombie(stopped["pid"])


def test_a_launch_of_ranks_gets_the_nccl_flight_recorder_into_the_run_dir_unless_the_user_set_it(
        tmp_path: Path) -> None:
    """PyTorch's NCCL flight recorder on, its dumps into RUN_DIR/nccl/, stack traces off; the user's own
    value wins; a command without a launcher is left as it was."""
    show = ("import os; print(*(f'{k}={os.environ.get(k)}' for k in ('TORCH_NCCL_TRACE_BUFFER_SIZE', "
            "'TORCH_NCCL_DUMP_ON_TIMEOUT', 'TORCH_INCLUDE_STACK_TRACE', 'TORCH_NCCL_DEBUG_INFO_TEMP_FILE')))")
    run_dir = tmp_path / "run"
    env = {**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}
    assert Supervisor(RunSpec((str(_torchrun(tmp_path)), "-c", show), tmp_path, run_dir, env, False, None),
                      parse_policy("restart:\n  max: 0\n", "policy.yaml")).run() in (0, 3)
    said = (run_dir / "attempt-1.log").read_text().split()
    assert said == ["TORCH_NCCL_TRACE_BUFFER_SIZE=64", "TORCH_NCCL_DUMP_ON_TIMEOUT=1", "TORCH_INCLUDE_STACK_TRACE=0",
                    f"TORCH_NCCL_DEBUG_INFO_TEMP_FILE={run_dir / 'nccl' / 'trace_'}"]
    assert (run_dir / "nccl").is_dir()
    plain = tmp_path / "plain"
    assert Supervisor(RunSpec((sys.executable, "-c", show), tmp_path, plain, dict(os.environ), False, None),
                      parse_policy("restart:\n  max: 0\n", "policy.yaml")).run() in (0, 3)
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT=None" in (plain / "attempt-1.log").read_text()


# The stand-in launchers' end: start both ranks, reap each the moment it ends (as torchrun's agent does).
REAPS_AT_ONCE = """
ranks = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    ranks.append(subprocess.Popen([os.environ["RANK_PYTHON"], "-c", rank_code], env=env))
codes = [os.waitpid(-1, 0)[1] for _ in ranks]
sys.exit(1 if any(codes) else 0)
"""

# Ranks reaped the moment they end (as torchrun's agent does), so trainsup cannot read how one ended: rank 1
# is done first and exits 0 while rank 0 still writes the final weights, for longer than a second or five.
REAPING_LAUNCHER = """
import os, subprocess, sys, time
rank_code = '''
import os, sys, time
print(f"rank {os.environ['RANK']} step 1", flush=True)
time.sleep(2.5)  # found by trainsup (it looks once a second)
if os.environ["RANK"] == "0":
    time.sleep(0.5)
    with open(os.environ["FINAL"], "w") as final:
        for part in range(70):
            final.write(f"part {part}\\\\n")
            final.flush()
            time.sleep(0.1)
        final.write("end\\\\n")
'''
""" + REAPS_AT_ONCE


def test_a_rank_that_ends_first_unread_does_not_stop_rank_0_writing_the_final_weights(tmp_path: Path) -> None:
    """A rank's end trainsup could not read is not a failure: the launcher, which read it, says if it was."""
    run_dir, final = tmp_path / "run", tmp_path / "final.txt"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", REAPING_LAUNCHER), tmp_path, run_dir,
                   {**os.environ, **RANK_ENV, "FINAL": str(final)}, False, None)
    code = Supervisor(spec, parse_policy("restart:\n  max: 0\nstop:\n  grace_s: 2\n", "policy.yaml")).run()
    events = read_events(run_dir)
    ended = {e["rank"]: e for e in events if e["event"] == "rank_ended"}
    assert ended[1]["exit_code"] is None and ended[1]["signal"] is None, ended  # reaped before trainsup read it
    assert final.read_text().endswith("part 69\nend\n"), "rank 0 was stopped while it wrote"
    (attempt_end,) = [e for e in events if e["event"] == "attempt_end"]
    assert (attempt_end["exit_code"], attempt_end.get("rank_ended")) == (0, None), attempt_end
    assert code in (0, 3)


def test_a_rescan_reads_the_environment_of_new_processes_only(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The watch rescans the launcher's tree every second for the attempt's life: a process's rank is read
    from its environment once, when it is first seen."""
    launcher = subprocess.Popen([str(_torchrun(tmp_path)), "-c", LAUNCHER], env={**os.environ, **RANK_ENV})
    reads: list[int] = []
    real_environ = psutil.Process.environ

    def counted(self: psutil.Process) -> dict[str, str]:
        reads.append(self.pid)
        return real_environ(self)

    try:
        _ranks(launcher.pid, True, 2)  # both ranks and their workers have started
        time.sleep(0.5)
        monkeypatch.setattr(psutil.Process, "environ", counted)
        watch = RankWatch(launcher.pid, True, rescan_s=0.0)
        watch.poll(0.0)
        first = len(reads)
        assert first >= 4 and [r.rank for r in watch.ranks] == [0, 1]  # two ranks, two workers
        for n in range(1, 6):
            watch.poll(float(n))
        assert len(reads) == first, f"{len(reads) - first} environments read again"
    finally:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            child.kill()
        launcher.kill()
        launcher.wait()


def test_each_attempt_says_the_rank_whose_death_stops_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Rank 1 killed in two attempts: each attempt's console says it once (the ranks stopped after it are
    journaled, not said)."""
    run_dir = tmp_path / "run"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", LAUNCHER), tmp_path, run_dir, {**os.environ, **RANK_ENV}, False,
                   None)
    sup = Supervisor(spec, parse_policy("restart:\n  max: 1\nbackoff:\n  initial_s: 0.1\nstop:\n  grace_s: 5\n",
                                        "policy.yaml"))
    killed: list[int] = []

    def kill_rank_1_of_each_attempt() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(killed) < 2:
            events = read_events(run_dir) if (run_dir / "events.jsonl").exists() else []
            found = [e for e in events if e["event"] == "ranks" and e["attempt"] == len(killed) + 1]
            if found and len(found[-1]["ranks"]) == 2:
                pid = next(r["pid"] for r in found[-1]["ranks"] if r["rank"] == 1)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_rank_1_of_each_attempt, daemon=True)
    killer.start()
    sup.run()
    killer.join()
    said = capsys.readouterr().err
    assert len(killed) == 2, said
    for attempt, pid in enumerate(killed, start=1):
        assert said.count(f"attempt {attempt}: rank 1 (pid {pid}) was killed by SIGKILL while its launcher still "
                          "runs: stopping every process of the attempt") == 1, said


# Rank 0 finishes (the success line, exit 0); rank 1 never leaves its teardown (seen: a rank of TRL's gloo
# ranks idle in its interpreter's exit for good once rank 0 had exited). The launcher waits for both.
STUCK_AT_EXIT_LAUNCHER = """
import os, subprocess, sys, time
rank_code = '''
import os, time
print(f"rank {os.environ['RANK']} step 1", flush=True)
time.sleep(2.5)  # found by trainsup (it looks once a second)
if os.environ["RANK"] == "0":
    print("run finished", flush=True)
else:
    time.sleep(600)
'''
""" + REAPS_AT_ONCE


def test_a_rank_stuck_in_its_exit_after_the_run_finished_is_stopped_and_the_run_ends_finished(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from trainsup.run import attempt

    monkeypatch.setattr(attempt, "RANKS_EXIT_GRACE_S", 2.0)  # 30 s in the product
    run_dir = tmp_path / "run"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", STUCK_AT_EXIT_LAUNCHER), tmp_path, run_dir,
                   {**os.environ, **RANK_ENV}, False, None, trainer={"success": "^run finished$"})
    started = time.monotonic()
    code = Supervisor(spec, parse_policy("restart:\n  max: 0\nstop:\n  grace_s: 2\n", "policy.yaml")).run()
    took = time.monotonic() - started
    events = read_events(run_dir)
    (attempt_end,) = [e for e in events if e["event"] == "attempt_end"]
    assert attempt_end["planned_stop"] == "stuck_at_exit", attempt_end
    assert [e["event"] for e in events][-1] == "finished" and code == 0, events[-3:]
    assert not [e for e in events if e["event"] == "fault"]
    said = [e["message"] for e in events if e["event"] == "info" and "stuck in its teardown" in e.get("message", "")]
    assert len(said) == 1 and "the run is done" in said[0], said
    assert took < 30, took
    # (the status read with the command line: a process gone meanwhile is skipped, never an error)
    assert not [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["cmdline"] and "rank_code" in
                " ".join(p.info["cmdline"]) and p.info["status"] != psutil.STATUS_ZOMBIE]


def test_without_a_success_line_the_last_step_and_a_rank_seen_to_exit_0_are_the_end(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No success line (the Hugging Face Trainer prints none): the steps bar at its total and rank 0's exit 0,
    read from its zombie, say the run is done; rank 1, idle in its teardown, is stopped."""
    from trainsup.run import attempt

    monkeypatch.setattr(attempt, "RANKS_EXIT_GRACE_S", 2.0)
    launcher = STUCK_AT_EXIT_LAUNCHER.replace('print("run finished", flush=True)',
                                              'print("step 1/2", flush=True); print("step 2/2", flush=True)')
    launcher = launcher.replace("codes = [os.waitpid(-1, 0)[1] for _ in ranks]", "codes = [ranks[1].wait()]")
    run_dir = tmp_path / "run"
    spec = RunSpec((str(_torchrun(tmp_path)), "-c", launcher), tmp_path, run_dir, {**os.environ, **RANK_ENV}, False,
                   None, trainer={"progress": r"^step (?P<step>\d+)/(?P<total>\d+)$"})
    code = Supervisor(spec, parse_policy("restart:\n  max: 0\nstop:\n  grace_s: 2\n", "policy.yaml")).run()
    events = read_events(run_dir)
    ended = {e["rank"]: e for e in events if e["event"] == "rank_ended"}
    assert ended[0]["exit_code"] == 0, ended
    (attempt_end,) = [e for e in events if e["event"] == "attempt_end"]
    assert attempt_end["planned_stop"] == "stuck_at_exit" and attempt_end["step"] == 2, attempt_end
    assert [e["event"] for e in events][-1] == "finished" and code == 0, events[-3:]
