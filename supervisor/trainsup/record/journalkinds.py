"""Owns the journal's vocabulary: every kind of record written to an ``events.jsonl`` and its fields.

A record is ``{"ts": ..., "event": KIND, **fields}`` (``record.journal``). This module names each KIND
once, as a constant (``RUN_START == "run_start"``), says in one line when it is written, and lists its
fields with what each means. Readers compare ``record.get("event")`` against these constants, never a
string of their own; writers may pass either (``tests/unit/test_journalkinds.py`` walks the package's
source and holds every ``.event(KIND, field=...)`` call to this table, and every kind here to a writer).

A field is written as ``name``, ``name: what it means`` or ``name?: ...``; the ``?`` marks a field some
records of the kind lack (a writer that does not know it, or a second writer with less to say). A
``null`` value means unknown. ``dynamic`` marks a kind whose writer passes a dict built elsewhere
(``**fields``): its fields are listed here, but only the readers' tests hold them.

The reference page ``docs/reference/journal.md`` is made from this table (``markdown()``); the test
says when the page falls behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Field:
    name: str
    note: str = ""
    sometimes: bool = False  # absent from some records of the kind


@dataclass(frozen=True)
class Kind:
    name: str
    when: str
    fields: tuple[Field, ...]
    more: str = ""  # words for fields beyond the list (``warning``: the adapter's own)
    dynamic: bool = False  # the writer passes its fields whole (``**fields``)

    @property
    def always(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields if not f.sometimes)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.fields)


def _kind(name: str, when: str, *fields: str, more: str = "", dynamic: bool = False) -> Kind:
    parsed = []
    for spec in fields:
        head, _, note = spec.partition(": ")
        parsed.append(Field(head.rstrip("?"), note, head.endswith("?")))
    return Kind(name, when, tuple(parsed), more, dynamic)


# --- the run's journal: RUN_DIR/events.jsonl ----------------------------------------------------------
RUN_START: Final = "run_start"
RUN_SEPARATE: Final = "run_separate"
PLAN_ADJUSTED: Final = "plan_adjusted"
ATTEMPT_START: Final = "attempt_start"
PRE_STEP_START: Final = "pre_step_start"
PRE_STEP_END: Final = "pre_step_end"
RANKS: Final = "ranks"
RANK_ENDED: Final = "rank_ended"
ATTEMPT_END: Final = "attempt_end"
FAULT: Final = "fault"
FAULT_LIVE: Final = "fault_live"
REMEDY: Final = "remedy"
REMEDY_SKIPPED: Final = "remedy_skipped"
ENVIRONMENT_UPGRADE: Final = "environment_upgrade"
HANG_STACKS: Final = "hang_stacks"
INFO: Final = "info"
WARNING: Final = "warning"
FINISHED: Final = "finished"
GAVE_UP: Final = "gave_up"
SUPERVISOR_RESTART: Final = "supervisor_restart"
# saved states and what the output dir shows
STATE_SAVED: Final = "state_saved"
STATE_ADOPTED: Final = "state_adopted"
STATE_SET_ASIDE: Final = "state_set_aside"
RESUME_EXACT: Final = "resume_exact"
RESUME_INEXACT: Final = "resume_inexact"
SEGMENT_RELAUNCH: Final = "segment_relaunch"
SAVE_PUBLISHED: Final = "save_published"
SAVE_HIDDEN: Final = "save_hidden"
SAVE_PRUNED: Final = "save_pruned"
SAMPLE_PUBLISHED: Final = "sample_published"
SAMPLE_HIDDEN: Final = "sample_hidden"
FINAL_PUBLISHED: Final = "final_published"
FINAL_NOT_PUBLISHED: Final = "final_not_published"
# live edits
FILE_CHANGED: Final = "file_changed"
CHANGE_SCHEDULED: Final = "change_scheduled"
CHANGE_APPLIED: Final = "change_applied"
CHANGE_REJECTED: Final = "change_rejected"
CACHE_INVALIDATED: Final = "cache_invalidated"
# GPUs, the supervisor and other hosts
GPU_RECLAIM: Final = "gpu_reclaim"
GPU_FOREIGN: Final = "gpu_foreign"
ORPHAN_STOPPED: Final = "orphan_stopped"
ORPHAN_NOT_SIGNALLED: Final = "orphan_not_signalled"
LEASE_TAKEN_OVER: Final = "lease_taken_over"
PREVIOUS_END_UNRECORDED: Final = "previous_end_unrecorded"
JOURNAL_LINE_CUT: Final = "journal_line_cut"
RECORDS_LOST: Final = "records_lost"
NOTIFY_FAILED: Final = "notify_failed"
# the deadline signal (Slurm)
DEADLINE: Final = "deadline"
REQUEUED: Final = "requeued"
REQUEUE_FAILED: Final = "requeue_failed"
NOT_REQUEUED: Final = "not_requeued"
REQUEUE_BUDGET_SPENT: Final = "requeue_budget_spent"
# --- the queue daemon's journal: STATE/events.jsonl ------------------------------------------------
SERVE_START: Final = "serve_start"
SERVE_STOP: Final = "serve_stop"
ENTRY_STARTED: Final = "entry_started"
ENTRY_ADOPTED: Final = "entry_adopted"
ENTRY_ENDED: Final = "entry_ended"
ENTRY_LOST: Final = "entry_lost"
ENTRY_REQUEUED: Final = "entry_requeued"
INBOX_ADDED: Final = "inbox_added"
INBOX_REJECTED: Final = "inbox_rejected"
QUEUE_EMPTY: Final = "queue_empty"

# A supervisor's last record: the run finished, stopped or gave up, or it handed the run to its successor.
END_EVENTS: Final = frozenset({FINISHED, GAVE_UP, SUPERVISOR_RESTART})
ENDS: Final = (FINISHED, GAVE_UP)  # how a run ends (a restart hands it on)


@dataclass(frozen=True)
class Section:
    title: str
    kinds: tuple[Kind, ...]
    intro: str = ""


SECTIONS: Final = (
    Section("The run", (
        _kind(RUN_START, "a supervisor starts the run",
              "argv", "run_dir", "policy: the policy's source",
              "project: the project's name, else the output name or the run dir's name",
              "trainer: the adapter", "samples: where the trainer's samples go"),
        _kind(RUN_SEPARATE, "the output dir holds another run's records: this run starts fresh in a run dir "
                            "of "
              "its own ([One output dir, many runs](../guides/one-output-dir.md))",
              "note: the line said on the console", "others: the run dirs of the other runs"),
        _kind(PLAN_ADJUSTED, "the adapter changed the command before the first launch (a fixed `--seed`, an "
                             "added "
              "save cadence, ...); one record per change, as said on the console", "note"),
        _kind(ATTEMPT_START, "a launch",
              "attempt", "argv: the command launched", "resume_from: the state dir, `null`: from the "
                                                       "beginning",
              "resume_step", "env: what trainsup set in the trainer's environment"),
        _kind(PRE_STEP_START, "a program the adapter runs before the attempt's trainer starts (musubi-tuner's "
              "caching scripts, when what its caches are made from changed)",
              "attempt", "step: its place among the attempt's programs, from 1", "argv", "says: what it does",
              "log: its output"),
        _kind(PRE_STEP_END, "that program ended (one that did not end with exit 0 stops the run)",
              "attempt", "step", "exit_code", "signal", "seconds"),
        _kind(RANKS, "the attempt found the processes that train under its launcher (torchrun, accelerate "
              "launch, Lightning's), or more of them", "attempt",
              "ranks: `{rank, pid}` each; `rank` `null`: the one trainer under a one-process launcher"),
        _kind(RANK_ENDED, "one of them ended while the launcher still ran (one that did not end with exit 0 "
              "makes trainsup stop every process of the attempt within seconds)",
              "attempt", "rank", "pid", "exit_code: `null` when it was reaped before trainsup read it",
              "signal"),
        _kind(ATTEMPT_END, "an attempt ended",
              "attempt", "exit_code", "signal",
              "child_status?: the real trainer's status behind a launcher such as accelerate",
              "child_signal?: the real trainer's signal behind a launcher", "uptime_s?", "steps_trained?",
              "step?: the true step reached",
              "skipped_lines?: lines the parser skipped under a flood; the log keeps every byte",
              "gpu?: the attempt's peaks per device",
              "rank_ended?: the rank (`trainer` under a one-process launcher) whose end made trainsup stop "
              "the launcher's processes; the attempt ended as that rank did",
              "nccl_dumps?: the NCCL flight recorder's dumps the attempt left in `RUN_DIR/nccl/` (a launch of "
              "ranks; PyTorch writes them when its watchdog times out)",
              "planned_stop?: `run_complete`: trainsup stopped the trainer once the last step was saved; "
              "`relaunch`: to relaunch it from a complete state, for an edit or an sd-scripts segment; "
              "`stuck_at_exit`: the run had finished and ranks stuck in their teardown were stopped; else "
              "`null`",
              "supervisor_lost?: `true` when written by the next supervisor for an attempt whose supervisor "
              "died"),
        _kind(FAULT, "an attempt ended on a fault",
              "class", "evidence: the line", "line: its number in `attempt-N.log`", "attempt",
              "gpu?: for `cuda_oom`: each device's peak, total and the other programs' share"),
        _kind(FAULT_LIVE, "a fault acted on while the trainer still runs (a NaN loss)",
              "class", "evidence", "line", "attempt"),
        _kind(REMEDY, "a remedy applied",
              "class", "rung: the index in the class's ladder", "actions: each change, as a person reads it",
              "delay_s: the backoff before the relaunch"),
        _kind(REMEDY_SKIPPED, "a rung that means nothing for this trainer or command, skipped",
              "class", "rung", "actions", "trainer", "reason"),
        _kind(ENVIRONMENT_UPGRADE, "the serializer upgrade of `fp8_serializer` ran (its output: "
                                   "`upgrade-N.log`)",
              "python: the trainer's interpreter", "spec: `safetensors>=0.4.2`", "exit_code"),
        _kind(HANG_STACKS, "a hang: the stacks taken before the tree is stopped",
              "attempt", "path: `hang-N.txt`", "processes", "py_spy: `true` when every process's stack was "
                                                            "read",
              "stragglers?: under a launcher, the ranks the others wait for (stopped, or outside the "
              "collective the others are in)"),
        _kind(INFO, "something said once (no GPU readable; a kill that was not for memory)",
              "attempt?", "message"),
        _kind(WARNING, "an adapter's warning: on the trainer's start-up summary, or an input edit the trainer "
                       "cannot see (musubi-tuner's cached captions and images)",
              "attempt", "message", more="the adapter's fields", dynamic=True),
        _kind(FINISHED, "training finished (a supervisor's last record)",
              "reason", "final_weights", "attempt",
              "trained_with: the list of [`trained-with.json`](../reference/faults.md#trained-with)"),
        _kind(GAVE_UP, "an end that is not a finish: the restart budget spent, a fault a restart cannot "
                       "fix, or a "
              "stop by a signal (a supervisor's last record)",
              "reason", "exit_code", "attempt", "trained_with"),
        _kind(SUPERVISOR_RESTART, "the project's command changed: trainsup starts itself anew on the edited "
                                  "file "
              "(a supervisor's last record)", "reason", "attempt"),
    )),
    Section("Saved states and what the output dir shows", (
        _kind(STATE_SAVED, "a state is complete",
              "dir", "step: true", "label: the trainer's own number", "attempt"),
        _kind(STATE_ADOPTED, "a state of your own (your `--resume`, or one found before the first launch) "
                             "taken "
              "into the ledger", "dir", "step"),
        _kind(STATE_SET_ASIDE, "a state past the resume point, one cut mid-save, or a weights file's "
                               "temporary write a killed attempt left, moved out of the trainer's way "
              "(`RUN_DIR/set-aside/`)", "dir", "step?", "to", "why?", "reason?", "attempt?"),
        _kind(RESUME_EXACT, "sd-scripts, the diffusers scripts: the resume point is the epoch end `epoch_end`",
              "newest: the newest complete state", "step: the newest's", "epoch_end",
              "state: the epoch-end state resumed from"),
        _kind(RESUME_INEXACT, "sd-scripts, the diffusers scripts: the newest epoch end is too far back; resumed "
                              "from the newest "
                              "state, not "
              "exactly ([Resume](../guides/resume.md))", "newest", "step", "epoch_end", "reason"),
        _kind(SEGMENT_RELAUNCH, "sd-scripts: the attempt is stopped at an epoch's end and relaunched from "
                                "it at once",
              "attempt", "step", "why"),
        _kind(SAVE_PUBLISHED, "a save published under its true name (hard links)", "src", "dst", "step?"),
        _kind(SAVE_HIDDEN, "a save trainsup made on its own account, moved into `RUN_DIR/saves/`",
              "dir", "step?", "to", "why"),
        _kind(SAVE_PRUNED, "one of trainsup's own saves deleted from `RUN_DIR/saves/` (never a published "
                           "one)",
              "dir", "step"),
        _kind(SAMPLE_PUBLISHED, "a sample published under your output name and its true step",
              "src", "dst", "step?", "epoch?: instead of `step`, for a sample named by its epoch"),
        _kind(SAMPLE_HIDDEN, "an attempt's own sample file moved into `RUN_DIR/saves/samples/`",
              "file", "to", "why"),
        _kind(FINAL_PUBLISHED, "the final weights published under your output name", "src", "dst"),
        _kind(FINAL_NOT_PUBLISHED, "LitGPT: `OUT/final` exists and is not this run's; the final weights "
                                   "stay where "
              "they are", "src", "dst", "reason"),
    )),
    Section("Live edits", (
        _kind(FILE_CHANGED, "a watched file changed ([Live edits](../guides/live-edits.md))",
              "path", "kind: `created`, `modified`, `deleted`"),
        _kind(CHANGE_SCHEDULED, "a valid edit, to be applied",
              "path", "apply: when: `now`, `at_checkpoint`, `next_launch`"),
        _kind(CHANGE_APPLIED, "the edit reached the trainer", "path", "attempt"),
        _kind(CHANGE_REJECTED, "an invalid edit (or a key that cannot change under a resume), not applied",
              "path", "reason", "line"),
        _kind(CACHE_INVALIDATED, "stale cache files moved to `RUN_DIR/invalidated/<timestamp>/`",
              "attempt", "files"),
    )),
    Section("GPUs, the supervisor and other hosts", (
        _kind(GPU_RECLAIM, "before a relaunch: the wait for the dead tree's GPU memory "
                           "([GPUs](../guides/gpus.md))",
              "attempt", "waited_s", "reclaimed", "still_held"),
        _kind(GPU_FOREIGN, "other programs hold memory on the trainer's GPUs before a launch",
              "attempt", "processes: gpu, pid, name, MiB each", "waited_s", "still_there"),
        _kind(ORPHAN_STOPPED, "the trainer of a dead supervisor, stopped before this run goes on",
              "attempt", "pids", "seconds"),
        _kind(ORPHAN_NOT_SIGNALLED, "a dead supervisor's trainer recorded by another host or boot: not "
                                    "signalled",
              "attempt", "host", "boot_id", "pids", "why: `other_host`, `earlier_boot`"),
        _kind(LEASE_TAKEN_OVER, "a dead supervisor's lease taken over "
              "([shared storage](../guides/robustness.md#a-run-dir-on-shared-storage-many-hosts))",
              "host", "boot_id", "pid", "age_s: of the old lease", "origin", "reason"),
        _kind(PREVIOUS_END_UNRECORDED, "the previous supervisor left no end in the journal",
              "started", "last_event", "last_ts", "attempt?", "fault?", "status_state?: from its "
                                                                        "`status.json`",
              "exit_code?: from its `status.json`", "reason?: from its `status.json`", dynamic=True),
        _kind(JOURNAL_LINE_CUT, "the journal's last line was cut (a supervisor killed inside a write): "
                                "taken off, "
              "kept here", "bytes", "text: the cut line, at most 2000 characters"),
        _kind(RECORDS_LOST, "records held on a full disk and dropped for room", "records", "reason"),
        _kind(NOTIFY_FAILED, "a notification could not be sent ([Notifications](../guides/notifications.md))",
              "kind", "title", "url: secrets masked", "error", dynamic=True),
    )),
    Section("The deadline signal (Slurm)", (
        _kind(DEADLINE, "the deadline signal came ([On a Slurm cluster](../guides/slurm.md))",
              "signal", "lead_s", "save_interval_s", "next_save_in_s", "stop_by_s",
              "choice: `wait_for_save`, `save_on_stop`, `stop_now`", "wait_for_save", "save_signal"),
        _kind(REQUEUED, "`scontrol requeue` done",
              "job_id", "restart_count", "state_step: the newest complete state", "streak"),
        _kind(REQUEUE_FAILED, "`scontrol requeue` failed", "job_id", "error", "state_step"),
        _kind(NOT_REQUEUED, "outside a Slurm job, or `slurm.requeue` off", "reason", "state_step"),
        _kind(REQUEUE_BUDGET_SPENT, "requeued too often without a new state: exit 3",
              "job_id", "restart_count", "requeues", "budget", "state_step"),
    )),
    Section("The queue daemon", (
        _kind(SERVE_START, "the daemon starts", "pid", "slots", "gpu: what the GPU probe found"),
        _kind(SERVE_STOP, "the daemon stops", "signal"),
        _kind(ENTRY_STARTED, "an entry's supervisor is started",
              "id", "project", "pid", "gpus", "launch: 1, then 2, ... when restarted", "run_dir"),
        _kind(ENTRY_ADOPTED, "a supervisor still alive from before the daemon's start, adopted", "id", "pid"),
        _kind(ENTRY_ENDED, "an entry ended",
              "id", "project", "state: `finished`, `failed`, `stopped`", "exit_code", "reason"),
        _kind(ENTRY_LOST, "an entry's supervisor died; it is started again on the same run dir",
              "id", "exit_code", "lost: how many times"),
        _kind(ENTRY_REQUEUED, "put back in the queue when the daemon stops", "id", "reason"),
        _kind(INBOX_ADDED, "a project file dropped into `STATE/inbox/` was queued",
              "file", "id", "project", "moved_to"),
        _kind(INBOX_REJECTED, "... or rejected", "file", "error", "moved_to"),
        _kind(QUEUE_EMPTY, "the last entry ended: the counts per state",
              "queued", "running", "finished", "failed", "stopped", dynamic=True),
    ), "`trainsup serve` writes `STATE/events.jsonl` in the same form; it also writes `notify_failed` "
       "(as in the run's journal)."),
)

KINDS: Final[dict[str, Kind]] = {kind.name: kind for section in SECTIONS for kind in section.kinds}


def _field_text(field: Field) -> str:
    text = f"`{field.name}`" + (f" ({field.note})" if field.note else "")
    return f"*{text}*" if field.sometimes else text


def markdown() -> str:
    """The reference page's tables, one section per ``Section`` (``docs/reference/journal.md``)."""
    out: list[str] = []
    for section in SECTIONS:
        out += [f"## {section.title}", ""]
        if section.intro:
            out += [section.intro, ""]
        out += ["| event | fields | when |", "|---|---|---|"]
        for kind in section.kinds:
            fields = ", ".join(_field_text(f) for f in kind.fields)
            if kind.more:
                fields += f", and {kind.more}"
            out.append(f"| `{kind.name}` | {fields} | {kind.when} |")
        out.append("")
    return "\n".join(out)
