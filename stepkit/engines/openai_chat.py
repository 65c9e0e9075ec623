"""The openai engine's local tokenizer and chat rendering.

A prompt is rendered text, so a chat must be turned into the served model's template text before it is
sent. With a local tokenizer (a prepared registry model, a local folder, or ``tokenizer=``) it is
rendered by transformers' ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
and the first rendering is checked once against the server's ``POST /tokenize`` (same token ids) when
the server has that endpoint: a mismatch switches to server rendering. Without one, vLLM's ``POST
/tokenize`` (``messages``, ``add_generation_prompt: true``) then ``POST /detokenize`` give the exact
template text. The local tokenizer also counts tokens for servers that return no token ids, and gives
the character offsets of the scoring path.
"""

from __future__ import annotations

import json
from pathlib import Path

from stepkit.engines.base import EngineUnavailable
from stepkit.engines.openai_http import ServerClient, one_line, server_message
from stepkit.errors import ConfigError


def local_tokenizer_path(model: str, tokenizer: str | None) -> str | None:
    """The folder of the local tokenizer for ``model``, or None (render chats on the server).

    ``tokenizer``: ``"server"`` (none), a registry name or a folder, or None (``model`` itself when it is a
    prepared registry name or a folder with a tokenizer).

    Raises:
        ConfigError: ``tokenizer`` names neither a registry model nor a folder holding a tokenizer (one line
            naming --tokenizer and the path, :func:`stepkit.models.check_folder`).
    """
    from stepkit.models import REGISTRY, is_prepared, model_dir, resolve_tokenizer

    if tokenizer == "server":
        return None
    if tokenizer is not None:
        return resolve_tokenizer(tokenizer, "--tokenizer")
    if model in REGISTRY:
        return str(model_dir(model)) if is_prepared(model) else None
    path = Path(model).expanduser()
    if path.is_dir() and ((path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()):
        return str(path.resolve())
    return None


class ChatRenderer:
    """Renders chats and counts tokens for one served ``model`` (see the module docstring).

    Attributes:
        path: the local tokenizer's folder, or None.
        source: ``"local"`` or ``"server"`` once the first chat is rendered (None before).
        check_note: how the local template was checked against the server (for provenance).
    """

    def __init__(self, server: ServerClient, model: str, path: str | None):
        self.server, self.model, self.path = server, model, path
        self.source: str | None = None
        self.check_note: str | None = None
        self._cache: dict[str, str] = {}
        self._tok = None  # transformers tokenizer, loaded lazily
        self._fast_tok = None  # tokenizers.Tokenizer, loaded lazily (token counting)

    def tokenizer(self):
        """The local transformers tokenizer (loaded on first use).

        Raises:
            ConfigError: it cannot be loaded.
        """
        if self._tok is None:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            try:
                self._tok = AutoTokenizer.from_pretrained(self.path)
            except Exception as exc:  # noqa: BLE001 - one clear line
                raise ConfigError(f"cannot load the tokenizer in {self.path}: "
                                  f"{type(exc).__name__}: {one_line(exc)}") from None
        return self._tok

    def count_local(self, text: str) -> int:
        """Tokens of ``text`` with the local tokenizer. Uses the ``tokenizers`` library on
        ``tokenizer.json`` when transformers is not loaded yet (importing transformers costs seconds)."""
        if self._tok is None and self._fast_tok is None:
            path = Path(self.path) / "tokenizer.json"
            if path.is_file():
                from tokenizers import Tokenizer

                self._fast_tok = Tokenizer.from_file(str(path))
        if self._tok is None and self._fast_tok is not None:
            return len(self._fast_tok.encode(text, add_special_tokens=False).ids)
        return len(self.tokenizer().encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to (no special tokens): locally, else with the server's ``/tokenize``.

        Raises:
            ConfigError: neither a local tokenizer nor a ``/tokenize`` endpoint.
        """
        if self.path:
            return self.count_local(text)
        response = self.server.control("POST", "/tokenize",
                                       json={"model": self.model, "prompt": text, "add_special_tokens": False})
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.server.root_url} cannot count tokens "
                              f"(HTTP {response.status_code})")
        return int(response.json()["count"])

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat template applied to ``messages`` with the generation prompt, cached per distinct
        ``messages``.

        Raises:
            ConfigError: no local tokenizer and the server has no ``/tokenize`` endpoint, or the
                template cannot render ``messages``.
            EngineUnavailable: server rendering needed and the server is unreachable after retries.
        """
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if self.source is None:
            self.source = "local" if self.path else "server"
            if self.source == "local":
                text = self._render_local(messages)
                self._check_local_template(messages, text)
                if self.source == "local":
                    self._cache[key] = text
                    return text
        text = self._render_local(messages) if self.source == "local" else self._render_server(messages)
        self._cache[key] = text
        return text

    def _render_local(self, messages) -> str:
        try:
            return self.tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except ValueError as exc:
            raise ConfigError(f"tokenizer {self.path} has no usable chat template: {one_line(exc)}") from None

    def _tokenize_messages(self, messages) -> list[int] | None:
        """Token ids of the chat-templated ``messages`` from the server, or None if it has no /tokenize."""
        response = self.server.control("POST", "/tokenize", json={"model": self.model, "messages": messages,
                                                                   "add_generation_prompt": True})
        if response.status_code in (404, 405, 501):
            return None
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.server.root_url} could not render the chat template "
                              f"(POST /tokenize: HTTP {response.status_code}: {server_message(response)})")
        return list(response.json()["tokens"])

    def _check_local_template(self, messages, text: str) -> None:
        try:
            served = self._tokenize_messages(messages)
        except (ConfigError, EngineUnavailable) as exc:
            self.check_note = f"not checked ({one_line(exc, 120)})"
            return
        if served is None:
            self.check_note = "not checked (no /tokenize endpoint)"
            return
        local = self.tokenizer().encode(text, add_special_tokens=False)
        if list(local) == served:
            self.check_note = "matches the server's /tokenize"
        else:
            self.source = "server"
            self.check_note = (f"local tokenizer {self.path} disagreed with the server's /tokenize; rendering "
                               f"on the server")

    def _render_server(self, messages) -> str:
        tokens = self._tokenize_messages(messages)
        if tokens is None:
            raise ConfigError(f"the server at {self.server.root_url} has no /tokenize endpoint to render chat "
                              f"prompts (not vLLM?); give the engine a local tokenizer (tokenizer=FOLDER)")
        response = self.server.control("POST", "/detokenize", json={"model": self.model, "tokens": tokens})
        if response.status_code != 200:
            raise ConfigError(f"the server at {self.server.root_url} could not detokenize the chat template "
                              f"(HTTP {response.status_code}: {server_message(response)})")
        return str(response.json()["prompt"])
