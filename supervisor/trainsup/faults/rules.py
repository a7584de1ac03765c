"""The fault rule table: which output lines are evidence for which fault.

Rules are data.  Each ``FaultRule`` names a fault id (the ids are interface: the
journal, ``diagnose --json`` and metrics labels use them) and the regexes whose
match on a cleaned output line (see ``linetext.clean_line``) counts as evidence.
This module holds the built-in table and turns a policy file's ``rules`` list into
the same shape (``userrules``: ``load_user_rules``, ``compose_rules``); ``scanner`` applies them.
``scanner.FaultScanner`` applies the table: per line, the FIRST rule in table order
that matches wins, so the order below encodes priority: specific wording before
the generic wording it contains (``/dev/shm`` full before disk full, a meta device
in a device-mismatch message before plain device mismatch, ``CUDA error: out of
memory`` before the catch-all ``CUDA error:``, a missing file inside a state dir
before a plain missing file).  Excludes then keep known look-alikes out.

Patterns are case-sensitive unless they say ``(?i)``; the built-ins avoid ``(?i)``
because the scanner's prefilter is cheapest with case-sensitive keys, and bound
every gap (``.{0,300}?``, never ``.*``) so a 64 KiB line cannot make a pattern
backtrack quadratically.  Every
built-in pattern carries a literal the prefilter can key on (a test checks this).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BUILTIN_RULES",
    "FAULT_IDS",
    "IGNORED_LINE_PATTERNS",
    "REQUIRED_VERSION",
    "FaultRule",
    "Strength",
]

Strength = Literal["root", "weak"]

# Every fault id of the interface.  ``hang`` is detected by a progress timer and
# ``unknown`` is what a failed attempt gets when nothing matched: neither has rules.
FAULT_IDS: tuple[str, ...] = (
    "meta_tensor",
    "device_mismatch",
    "te_cache_none",
    "fp8_serializer",
    "cuda_oom",
    "disk_full",
    "shm_exhausted",
    "nccl_timeout",
    "nccl_error",
    "cuda_fatal",
    "corrupt_checkpoint",
    "nan_loss",
    "nan_latents",
    "host_oom_killed",
    "flag_conflict",
    "fp8_op_unsupported",
    "config_error",
    "missing_dependency",
    "hang",
    "unknown",
)

ID_SHAPE = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True)
class FaultRule:
    """One fault and the output wording that is evidence for it.

    ``strength="weak"`` marks launcher noise and secondary evidence (accelerate's
    ``CalledProcessError``, a bare ``Killed``): it decides the verdict only when no
    root evidence exists.  ``live=True`` asks the supervisor to act while the child
    still runs (a NaN loss never stops the trainer by itself).  ``frames_require``
    and ``frames_exclude`` are regexes over the frames (``"<file basename> <func>"``)
    of the traceback the matching line ends: when frames are visible, the innermost
    frame matching either list decides; when none matches, a rule that requires
    frames is refuted and one that only excludes frames stands.  With no frames in
    sight the message alone decides, unless ``frames_needed``.  ``cut_frames`` and
    ``cut_hints`` judge a traceback without a telling exception line (see ``frames``):
    the innermost of its frames matching ``cut_frames`` or ``frames_exclude`` decides,
    with one of the hints in sight (a rule without hints: the frames alone).  ``frames_forbid``
    refutes wherever the frame sits (a None in caption caching is no sample prompt's).
    ``lookalikes`` are excludes for output that is harmless altogether (a caught import probe): such a
    line is not even an ``unknown`` failure, as a line another rule's ``excludes`` refute is.
    ``first_cause``: evidence that stands over a later crash it caused (out of memory); ``tail``:
    evidence only for a log that ends at it (see ``verdict``); ``consequence``: the failure of a collective
    between ranks, which an earlier failure (another rank's exception, named by a rule or not) explains.
    """

    id: str
    patterns: tuple[str, ...]
    excludes: tuple[str, ...] = ()
    strength: Strength = "root"
    restartable: bool = True
    explanation: str = ""
    live: bool = False
    frames_require: tuple[str, ...] = ()
    frames_exclude: tuple[str, ...] = ()
    frames_needed: bool = False  # without frames in sight the message alone does not decide
    cut_frames: tuple[str, ...] = ()  # a traceback cut before its exception line: see ``frames``
    cut_hints: tuple[str, ...] = ()
    frames_forbid: tuple[str, ...] = ()  # any frame matching one refutes, wherever it sits
    lookalikes: tuple[str, ...] = ()  # excludes that mark harmless output: no failure at all
    first_cause: bool = False  # the crashes it leads to (other ranks, cleanup) do not outrank it
    tail: bool = False  # evidence only while nothing follows it (a wait the log ends at)
    consequence: bool = False  # an earlier failure (another rank's) stands over it (see ``verdict``)

    def __post_init__(self) -> None:
        # A bad table is a programming error; fail at construction, naming the rule.
        if ID_SHAPE.fullmatch(self.id) is None:
            raise ValueError(f"fault rule id {self.id!r}: expected lowercase letters, digits and _")
        if self.strength not in ("root", "weak"):
            raise ValueError(f"fault rule {self.id}: strength: expected 'root' or 'weak', got {self.strength!r}")
        if not self.patterns and not self.cut_frames:
            raise ValueError(f"fault rule {self.id}: patterns: expected at least one regex")
        for field in ("patterns", "excludes", "frames_require", "frames_exclude", "cut_frames", "cut_hints",
                      "frames_forbid", "lookalikes"):
            for i, pattern in enumerate(getattr(self, field)):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"fault rule {self.id}: {field}[{i}]: invalid regex {pattern!r}: {exc}") from None


# Lines that are never evidence, whatever they mention: Python warnings (a
# UserWarning about CUDA or a FutureWarning naming an error class is harmless) and
# TensorFlow probing for optional CUDA libraries, which training venvs often carry.
IGNORED_LINE_PATTERNS: tuple[str, ...] = (
    r"\b[A-Z][a-z]+Warning: ",
    r"Could not load dynamic library",
    r"\b[IW] tensorflow/",
    r"CUDA[ _]SETUP",  # old bitsandbytes' start-up diagnostics (training goes on)
)

# Frame sets of the built-in rules (regexes over ``"<file basename> <function>"``, judged by ``frames``).
# A trainer's sampling and text-encoding functions (its sample-image code, text-encoding strategies of
# the Flux/SD3 trainers and their GUI copies): a None there is a prompt without a cached text-encoder output.
SAMPLING_FRAMES: tuple[str, ...] = (
    r"sample", r"prompt", r"get_text_cond", r"text_encod", r"te_outputs", r"get_hidden_states",
)
# Code that loads data or models: a None there is a missing image, caption or weight.
LOADER_FRAMES: tuple[str, ...] = (r"__getitem__", r"(?<![a-z])load_", r"[Dd]ataset", r"[Dd]ata[Ll]oader")
# Text embeddings computed for the dataset's captions before training (a trainer's dataset caching and
# its strategies, SimpleTuner's embed cache, any "caption" code): a None there is a caption's, however
# prompt-like the inner frames are named.
CAPTION_CACHE_FRAMES: tuple[str, ...] = (
    r"[Cc]aption", r" (?:new_)?cache_text_encoder_outputs$", r" cache_batch_outputs$", r"compute_(?:text_)?embeddings",
    r"^text_embed_cache\.py ", r"[Pp]recompute",
)

_ERROR_CLASS = r"(?:AssertionError|ValueError)"
# transformers' import-time dependency check (``dependency_versions_check``): ``ImportError:
# safetensors>=0.4.3 is required for a normal functioning of this module, but found safetensors==0.4.1.``
# Its named groups, ``pkg`` and ``specs``, travel on the evidence to the remedy (``remedies.required_spec``).
_SPEC = r"(?:===?|[<>!~]=?)\s*[\w.*+!-]+"
REQUIRED_VERSION = (r"(?P<pkg>[A-Za-z0-9][\w.-]*)\s*(?P<specs>" + _SPEC + r"(?:\s*,\s*" + _SPEC + r")*)"
                    r" is required for a normal functioning")

BUILTIN_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="shm_exhausted",
        patterns=(
            r"/dev/shm\b.{0,300}?(?:No space left|Errno 28|[Bb]us error)",
            r"(?:No space left on device|Errno 28).{0,300}?/dev/shm",
            r"unable to write to file </torch_", r"unable to mmap \d+ bytes from file </torch_",
            r"is killed by signal: Bus error", r"(?:out of|insufficient) shared memory",
            r"[Uu]nexpected bus error encountered in worker",
            # Too many open files while sharing tensors: the same cure (fewer workers).
            r"unable to open shared memory object",
        ),
        explanation="The DataLoader workers ran out of shared memory (/dev/shm); fewer workers need less.",
    ),
    FaultRule(
        id="fp8_serializer",
        patterns=(
            r"KeyError: torch\.float8_e[45]m\d", r"dtype torch\.float8_\w+ (?:is )?not recognized",
            # the same old safetensors loading a float8 checkpoint
            r"Dtype not understood: F8_E[45]M\d",
            r"load_model\(\) got an unexpected keyword argument 'device'",
            # transformers' import-time dependency check: the same old serializer, caught before any save
            r"(?P<pkg>safetensors)(?P<specs>>=[\d.]+) is required for a normal functioning",
        ),
        # A traceback through the state or weight save, with a float8 dtype in sight.
        cut_frames=(r" save_state$", r" save_file$", r" save_weights$", r" save_model(?:_hook)?$", r" _flatten$",
                    r" _tobytes$", r"^safetensors"),
        cut_hints=(r"float8_e[45]m", r"F8_E[45]M"),
        explanation="The trainer's safetensors is too old for float8 weights (0.4.2 saves them, 0.4.3 loads "
        "them with a device; transformers refuses to import with a release below the one it requires); "
        "upgrade it in the trainer's own environment.",
    ),
    FaultRule(
        id="fp8_op_unsupported",
        patterns=(r"not implemented for 'Float8_e[45]m\w*'", r"Promotion for Float8 Types is not supported",
                  # PyTorch's wording when float8 weights meet an input that autocast did not cast
                  # (an autocast the device refuses: seen on a CPU; the adapter's ladder says what to change)
                  r"must have the same dtype, but got (?:\w+ and Float8_e[45]m\w*|Float8_e[45]m\w* and \w+)"),
        explanation="An operation has no float8 kernel on this setup, or float8 weights meet an input that "
        "was not cast to them, so the model cannot be kept in float8 this way here.",
    ),
    FaultRule(
        id="meta_tensor",
        patterns=(
            r"Cannot copy out of meta tensor", r"Module\.to_empty\(\) instead of torch\.nn\.Module\.to\(\)",
            r"Tensor\.item\(\) cannot be called on meta tensors",
            # Parameters left on the meta device show up as a device mismatch too.
            r"found at least two devices, (?:meta and \w+|[\w:]+ and meta\b)",
            r"\bis on meta, different from other tensors", r"Tensor on device meta is not on the expected device",
        ),
        explanation="Part of the model was never loaded (it is still on the meta device), usually because "
        "the checkpoint's key layout does not match the model.",
    ),
    FaultRule(
        id="device_mismatch",
        patterns=(
            r"Expected all tensors to be on the same device", r"found at least two devices",
            r"\bis on (?:cpu|cuda:\d+|mps:\d+|xpu:\d+), different from other tensors on",
            r"Input type \(torch\.cuda\.\w+\) and weight type \(torch\.(?!cuda\.)\w+\)",
            r"Input type \(torch\.(?!cuda\.)\w+\) and weight type \(torch\.cuda\.",
            r"Expected object of device type \w+ but got device type",
        ),
        explanation="Tensors on the CPU and on the GPU met in one operation, typically through cached "
        "latents or text-encoder outputs that stayed on the wrong device.",
    ),
    FaultRule(
        id="cuda_oom",
        patterns=(
            r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error: out of memory", r"HIP out of memory",
            r"MPS backend out of memory", r"Including non-PyTorch memory",
            # torch 2.0-2.1 misspelt "capacity"; either spelling, for wrapped messages.
            r"GPU \d+ has a total capac(?:i|)ty of",
            r"CUBLAS_STATUS_ALLOC_FAILED", r"CUDNN_STATUS_ALLOC_FAILED", r"cudaErrorMemoryAllocation",
            # cuBLAS cannot even create its handle when the card is full.
            r"CUBLAS_STATUS_NOT_INITIALIZED when calling `?cublasCreate", r"Cuda failure '?out of memory",
            r"HIP error: out of memory", r"hipErrorOutOfMemory",
            # A trainer's own words for it (torch's message cut off, or never printed).
            r"\b(?:GPU|VRAM) (?:ran )?out of memory\b", r"\bout of (?:GPU|VRAM) memory\b",
            r"No executable batch size found, reached zero",  # accelerate's find_executable_batch_size
            r"\bOOM when allocating tensor", r"ResourceExhaustedError",
        ),
        first_cause=True,
        explanation="The GPU ran out of memory.",
    ),
    FaultRule(
        id="nccl_timeout",
        # Any backend's collective timeout (the id keeps its first backend's name: ids are interface).
        # ``ms``: the timeout the process group was given, which the remedy raises (see ``remedies``).
        patterns=(
            r"Watchdog caught collective operation timeout: .{0,300}?Timeout\(ms\)=(?P<ms>\d+)",
            r"Watchdog caught collective operation timeout", r"ran for \d+ milliseconds before timing out",
            r"Heartbeat monitor timed out", r"DistStoreError: .{0,300}?[Tt]imed out",
            # gloo, the CPU backend: a send or recv of a collective waited out the group's timeout
            r"Timed out waiting (?P<ms>\d+)ms for (?:send|recv) operation",
            r"gloo/.{0,300}?\] Timed out\b",
        ),
        consequence=True,
        explanation="A collective operation between ranks timed out (NCCL's watchdog, gloo): the other ranks "
        "waited longer than the process group's timeout for one that was elsewhere: stalled, or busy in "
        "work only it does (caching, sampling, validation, saving).",
    ),
    FaultRule(
        id="nccl_error",
        patterns=(
            r"NCCL [Ee]rror", r"DistBackendError", r"NCCL communicator was aborted",
            r"\bnccl(?:InternalError|UnhandledCudaError|SystemError|InvalidArgument|InvalidUsage|RemoteError)\b",
            r"NCCL watchdog thread terminated with exception",
            # gloo: the peer's end of the connection went away (its process died)
            r"gloo/.{0,300}?\] .{0,100}?Connection closed by peer",
        ),
        consequence=True,
        explanation="Communication between ranks (NCCL, gloo) failed.",
    ),
    FaultRule(
        id="missing_dependency",
        patterns=(
            r"ModuleNotFoundError", r"No module named ",
            # an import-time version check names what to install (a narrower wording of the next pattern)
            r"\bImportError: " + REQUIRED_VERSION, r"\bImportError\b", r"cannot import name '",
            r"library but it was not found in your environment", r"Torch not compiled with CUDA enabled",
            # No usable GPU at all: neither a restart nor a flag change fixes the
            # environment, so it stops with the other environment faults.
            r"No CUDA GPUs are available", r"Found no NVIDIA driver on your system",
            r"NVIDIA driver on your system is too old", r"CUDA driver version is insufficient for CUDA runtime",
            r"no kernel image is available for execution on the device", r"_base requires torch>=",
            r"hipErrorNoBinaryForGpu", r"HIP error: invalid device function",
            r"DLL load failed", r"cannot open shared object file", r"undefined symbol: ",
            r"CUDA Setup failed despite GPU being available",  # bitsandbytes without a usable build
        ),
        # xformers and bitsandbytes print a caught "No module named 'triton'" and go on.
        lookalikes=(r"Error caught was", r"No module named '?triton", r"some optimizations will not be enabled"),
        restartable=False,
        explanation="The trainer's environment lacks a package, a working CUDA build of torch, or a GPU.",
    ),
    FaultRule(
        id="cuda_fatal",
        patterns=(
            r" illegal memory access", r" unspecified launch failure", r"AcceleratorError",
            r"device-side assert(?:ion)? triggered", r"Assertion `.{0,500}?` failed\.", r"CUBLAS_STATUS_[A-Z_]+",
            r"CUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|MAPPING_ERROR)",
            r"illegal instruction was encountered", r"error: misaligned address", r"uncorrectable ECC error",
            # ROCm: HIP's device-side assertions end in an apostrophe, and say neither CUDA nor RuntimeError.
            r"[Dd]evice-side assertion `.{0,500}?' failed", r"HSA_STATUS_ERROR_\w+", r"Memory access fault by GPU",
            r"\bhipError(?:IllegalAddress|LaunchFailure|Assert)\b",
            r"CUDA error: ",  # any other CUDA error; the specific ones are claimed by rules above
            r"HIP error: ",
        ),
        excludes=(r"invalid device ordinal",),
        explanation="The GPU reported a fatal error (illegal access, launch failure, device-side assert or a "
        "cuBLAS failure); the CUDA context is lost and the process must start over.",
    ),
    FaultRule(
        id="corrupt_checkpoint",
        patterns=(
            r"HeaderTooLarge", r"MetadataIncompleteBuffer", r"InvalidHeaderDeserialization",
            r"Error while deserializing header", r"incomplete metadata, file not fully covered",
            r"PytorchStreamReader failed", r"Error loading file: .{0,1000}?\.npz", r"BadZipFile", r"UnpicklingError",
            r"EOFError: Ran out of input",
            # torch.load's older wordings for a truncated or foreign file
            r"unexpected EOF(?:, expected \d+ more bytes)?\. The file might be corrupted",
            r"[Ii]nvalid magic number; corrupt file\?", r"storage has wrong size: expected",
            # A state dir that exists but lacks one of its files is an incomplete
            # state, not a bad --resume path (that one is config_error below).
            (r"No such file or directory: '[^']*-state[/\\]+(?:optimizer\.bin|scheduler\.bin|scaler\.pt"
             r"|random_states_\d+\.pkl|model\.safetensors|pytorch_model\.bin)'"),
        ),
        # On Windows a DataLoader worker that fails to start ends in the same
        # "EOFError: Ran out of input", raised while unpickling in spawn.py.
        # (torch.multiprocessing.spawn's _wrap runs a training worker: that one counts)
        frames_exclude=(r"^spawn\.py (?:_main|spawn_main)$", r"^(?:reduction|popen_spawn_win32)\.py ",),
        explanation="A saved state or cache file cannot be read: it is truncated or corrupt.",
    ),
    FaultRule(
        id="te_cache_none",
        patterns=(
            r"'NoneType' object has no attribute '(?:to|ndim)'", r"not enough values to unpack \(expected 4, got 0\)",
            # sampling before the prompts were encoded at all (a Flux/SD3 trainer's prompt cache attribute)
            r"has no attribute 'sample_prompts_te_outputs'",
        ),
        # The same AttributeError from a dataset or a model loader is a different bug.
        excludes=(r"[Dd]ata[Ll]oader", r"[Dd]ataset", r"__getitem__", r"(?<![a-z])load_\w", r"[Cc]aption"),
        # The scanner checks the frames of the traceback the message ends: sampling
        # code confirms, a dataset or loader frame refutes (innermost frame first),
        # frames of neither kind refute; with no frames in sight the message decides.
        frames_require=SAMPLING_FRAMES,
        frames_exclude=LOADER_FRAMES,
        # A None in sight of sampling frames: a message, a printed tuple of text-encoder outputs with
        # holes, or the code of a frame reading the cache (all a cut traceback may show).
        cut_frames=SAMPLING_FRAMES,
        cut_hints=(r"NoneType", r"\bNone, None\b", r"sample_prompts_te_outputs", r"\binput_ids2\b"),
        # Text embeddings pre-computed for the captions: a None there is a caption's, and dropping
        # text-encoder caching would not help.
        frames_forbid=CAPTION_CACHE_FRAMES,
        explanation="A sample prompt has no entry in the text-encoder output cache (it was edited or added "
        "after the cache was built).",
    ),
    FaultRule(
        id="nan_latents",
        patterns=(r"NaN detected in (?:flipped )?latents",),
        explanation="The VAE produced NaN latents, usually from running it in half precision.",
    ),
    FaultRule(
        id="nan_loss",
        # a progress bar's postfix; any other progress or metrics shape that names a loss is read by ``ending``.
        patterns=(r"loss=nan\b",),
        live=True,
        explanation="The training loss became NaN; the trainer keeps going but learns nothing.",
    ),
    FaultRule(
        id="flag_conflict",
        patterns=(
            # The usual wording of a trainer's start-up assertion (a trainer's own: its adapter's rules).
            (_ERROR_CLASS + r": .{0,300}?\b(?:cannot be used|can't be used|cannot be trained|cannot be specified)"
             r" (?:with|together|at the same time)"),
            _ERROR_CLASS + r": .{0,300}?\b(?:is|are) not supported with --?\w",
        ),
        explanation="The trainer refused a combination of options at start-up.",
    ),
    FaultRule(
        id="disk_full",
        patterns=(
            r"No space left on device", r"Errno 28\b", r"\bStorageFull\b", r"\bENOSPC\b", r"Disk quota exceeded",
            r"PytorchStreamWriter failed writing file", r"unexpected pos \d+ vs \d+",
            r"\b\d+ requested and \d+ written",  # numpy's short write (np.savez of a latent cache)
        ),
        # A full /dev/shm is shm_exhausted; a refused write is a permission problem.
        excludes=(r"/dev/shm", r"</torch_", r"PermissionError", r"Permission ?[Dd]enied", r"Errno 13\b"),
        restartable=False,
        explanation="The disk is full; a restart would fail the same way until space is freed.",
    ),
    FaultRule(
        id="config_error",
        patterns=(
            r"error: unrecognized arguments:", r"error: argument --?\w", r"error: the following arguments are required",
            r"FileNotFoundError", r"No such file or directory", r"NotADirectoryError", r"IsADirectoryError",
            r"TOMLDecodeError", r"TomlDecodeError", r"Invalid TOML",
            r"PermissionError", r"Permission denied", r"PermissionDenied", r"Errno 13\b",
            # accelerate's load_state on a --resume path that is not a directory.
            r"Tried to find .{0,1000}? but folder does not exist",
            r"error: invalid device ordinal", r"Invalid user config", r"voluptuous\.error\.\w*Invalid",
            r"does not appear to have a file named", r"is not a local folder and is not a valid model identifier",
            r"RepositoryNotFoundError", r"GatedRepoError", r"RuntimeError: File .{0,1000}? cannot be opened\.",
            r"Parent directory .{0,1000}? does not exist", r"AssertionError: \w+ is required$",
        ),
        restartable=False,
        explanation="The command or its configuration is wrong (an argument, a path, a TOML file, a "
        "permission or a missing dataset); a restart cannot fix it.",
    ),
    FaultRule(
        id="config_error",
        # load_state_dict of a state saved with another network size (a LoRA rank or width)
        patterns=(r"size mismatch for [\w.]+: copying a param with shape",),
        restartable=False,
        explanation="A saved state or weights file was made for a model of other shapes (another network "
        "dim or rank than this command's): it cannot be loaded, and a restart cannot fix that. Resume with "
        "the settings it was saved with, or start fresh in another output dir.",
    ),
    FaultRule(
        id="host_oom_killed",
        patterns=(
            r"^Killed$", r"\d+ Killed\b", r"died with <Signals\.SIGKILL: 9>",
            r"returned non-zero exit status (?:-9|137)\b", r"^exitcode\s+: -9\b", r" \(exitcode: -9\)",
            r"exit code (?:-9|137)\b", r"exit code: (?:-9|137)\b", r"Signal 9 \(SIGKILL\)",
            r"is killed by signal: Killed", r"Out of memory: Killed process",
            r"(?:^|\]\s*)Killed$",  # a shell's report glued to the last bar
            r"^zsh: killed\s",  # (bash's job report is "14: 40211 Killed ...", above)
            r"exits with return code = -9\b",  # DeepSpeed's launcher
            r"exited with (?:exit )?code:? (?:-9|137)\b",
            r"terminated with signal SIGKILL", r"Killed by signal 9\b", r" killed by signal 9\b",
            r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)",
        ),
        strength="weak",
        explanation="The process was killed (SIGKILL), most often by the kernel when host RAM ran out.",
    ),
)
