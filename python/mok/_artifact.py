# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What every compile returns: mok.Artifact, and the IR stages it keeps."""
import abc
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Mapping

from ._options import CompileOptions

# Every stage a compile can show, in pipeline order: the input, the training
# functions (moe-generate-backward), the megakernel schedule (convert-moe-to-
# mk), the GPU kernels (convert-mk-to-gpu), the LLVM dialect (the CPU target:
# what was JIT-compiled; GPU targets: the NVVM kernels just before PTX
# emission), and the PTX.
STAGE_NAMES = ("moe", "training", "mk", "gpu", "llvm", "ptx")


class Stages(Mapping):
    """The IR text of each step of a compile, by stage name (read-only).

    `names` are the stages the compile had, in order; `texts` those at hand.
    A stage not at hand (an artifact from the cache keeps only the small
    ones) is made on first access by `regenerate()`, which compiles the
    layer again and returns every stage's text."""

    def __init__(self, names, texts, regenerate=None):
        self._names = tuple(names)
        self._texts = dict(texts)
        self._regenerate = regenerate

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(f"stages: no stage {name!r} in this compile; it has "
                           f"{', '.join(self._names)}")
        if name not in self._texts:
            if self._regenerate is None:
                raise KeyError(f"stages: {name!r} was not kept, and this artifact cannot "
                               "compile it again")
            self._texts.update(self._regenerate())
            self._regenerate = None
        return self._texts[name]

    def __contains__(self, name):
        # (Mapping's would read the stage, and so compile it again.)
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def at_hand(self):
        """The stages held now, without compiling any: {name: text}."""
        return {n: self._texts[n] for n in self._names if n in self._texts}

    def __repr__(self):
        held = [n if n in self._texts else f"{n} (on demand)" for n in self._names]
        return f"Stages({', '.join(held)})"


class Artifact(abc.ABC):
    """What mok.compile returns, for every target:

    - `target`: "cpu", "sm_90a" or "sm_100a";
    - `options`: the mok.CompileOptions it was compiled with, as the target
      took them (None for GPU kernels read from files that do not record
      them);
    - `stages`: the IR of each step of the compile, by name ("moe",
      "training", "mk", "gpu", "llvm", "ptx": those the target has);
    - `save(directory)`: writes what `load` needs elsewhere; returns the
      path the class's `from_files` reads back (GPU artifacts:
      `save(directory, cubin=True)` also writes the kernels' machine code
      for the target, made by ptxas, which `load` then uses instead of the
      driver's JIT);
    - `load(device=None)`: the callable layer (a CompiledLayer is one
      already: it returns itself; GPU artifacts load onto a CUDA device).

    Subclasses: CompiledLayer (the CPU target), GpuArtifact (one GPU
    kernel), GpuTrainingArtifact (the training forward and backward)."""

    target = None
    options = None
    _stages = None
    _no_stages = ("this artifact holds no IR stages (it was read from files, which keep "
                  "the kernels only); compile it with mok.compile to get them")

    @property
    def stages(self):
        if self._stages is None:
            raise ValueError(f"stages: {self._no_stages}")
        return self._stages

    @abc.abstractmethod
    def save(self, directory):
        """Writes the artifact into `directory`; returns the path that the
        class's from_files reads."""

    @abc.abstractmethod
    def load(self, device=None):
        """The callable layer."""


# Saved beside an artifact's files: its target and options (JSON), so that
# from_files gives them back.
OPTIONS_SUFFIX = ".options.json"


def write_options(base, target, options):
    """Writes <base>.options.json: the target and `options` (if known)."""
    if options is None:
        return
    with open(base + OPTIONS_SUFFIX, "w") as f:
        json.dump({"target": target, "options": options.as_dict()}, f, indent=2,
                  sort_keys=True)


def read_options(base):
    """(target, CompileOptions) from <base>.options.json, or (None, None)
    without that file; ValueError naming the file when it is malformed."""
    path = base + OPTIONS_SUFFIX
    if not os.path.exists(path):
        return None, None
    try:
        with open(path) as f:
            saved = json.load(f)
        return saved["target"], CompileOptions.from_dict(saved["options"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not the target and options an artifact's save() "
                         f"writes ({error})") from None


# Saved beside a GPU kernel's <base>.ptx (save(..., cubin=True), mok-compile
# --cubin): its machine code for the target, made by ptxas, and what it was
# made from (JSON: "chip", "ptx_sha256"), so that a cubin is never
# used with other PTX than its own.
CUBIN_SUFFIX = ".cubin"
CUBIN_INFO_SUFFIX = ".cubin.json"


def find_ptxas(toolkit=None):
    """The ptxas of `toolkit` (a CUDA toolkit directory), else $CUDA_HOME's,
    else /usr/local/cuda's, else the one on PATH; FileNotFoundError saying
    where it looked."""
    looked = []
    roots = [toolkit] if toolkit else [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    for root in roots:
        if root:
            path = os.path.join(root, "bin", "ptxas")
            looked.append(path)
            if os.access(path, os.X_OK):
                return path
    if not toolkit:
        found = shutil.which("ptxas")
        if found:
            return found
        looked.append("PATH")
    raise FileNotFoundError(f"cubin: ptxas (the CUDA toolkit's assembler) is needed to "
                            f"make a cubin; looked in {', '.join(looked)}")


def make_cubin(ptx, target, toolkit=None):
    """The cubin ptxas makes of `ptx` for `target` ("sm_90a"): bytes.
    FileNotFoundError without ptxas, RuntimeError with its messages when it
    fails."""
    ptxas = find_ptxas(toolkit)
    with tempfile.TemporaryDirectory(prefix="mok-ptxas-") as tmp:
        source, out = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, f"-arch={target}", source, "-o", out],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"cubin: {ptxas} -arch={target} failed (exit "
                               f"{proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
        with open(out, "rb") as f:
            return f.read()


def _ptx_sha256(ptx):
    return hashlib.sha256(ptx.encode()).hexdigest()


def write_cubin(base, cubin, ptx, target):
    """Writes <base>.cubin and <base>.cubin.json (what it was made from); a
    `cubin` None removes both (so no cubin is left beside other PTX)."""
    if cubin is None:
        for suffix in (CUBIN_SUFFIX, CUBIN_INFO_SUFFIX):
            if os.path.exists(base + suffix):
                os.remove(base + suffix)
        return
    with open(base + CUBIN_SUFFIX, "wb") as f:
        f.write(cubin)
    with open(base + CUBIN_INFO_SUFFIX, "w") as f:
        json.dump({"chip": target, "ptx_sha256": _ptx_sha256(ptx)}, f, indent=2,
                  sort_keys=True)


def read_cubin(base, ptx, target):
    """<base>.cubin when it was made from `ptx` for `target` (as
    <base>.cubin.json says), else None: without the file; with a warning
    when it is there but made from other PTX, for another chip, or without
    its .cubin.json (a cubin is never loaded with PTX it was not made
    from)."""
    if not os.path.exists(base + CUBIN_SUFFIX):
        return None
    try:
        with open(base + CUBIN_INFO_SUFFIX) as f:
            info = json.load(f)
        made_from, chip = info["ptx_sha256"], info["chip"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        warnings.warn(f"{base}{CUBIN_SUFFIX} ignored: {base}{CUBIN_INFO_SUFFIX} does not say "
                      f"what it was made from ({error}); write both with save(..., "
                      f"cubin=True) or mok-compile --cubin", stacklevel=3)
        return None
    if made_from != _ptx_sha256(ptx) or chip != target:
        warnings.warn(f"{base}{CUBIN_SUFFIX} ignored: it was made from other PTX or for "
                      f"another chip ({chip}) than {base}.ptx ({target}); the PTX is "
                      f"loaded instead", stacklevel=3)
        return None
    with open(base + CUBIN_SUFFIX, "rb") as f:
        return f.read()
