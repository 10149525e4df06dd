"""A model's chat template, chosen and applied as lm-eval 0.4.13's HFLM chooses and applies it.

Choosing (TemplateLM.chat_template): a tokenizer with several named templates uses the one named, else its
"default"; a tokenizer with one template uses it (a name given then only draws a warning, as in lm-eval).
Applying (HFLM.apply_chat_template): `tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=..., continue_final_message=not add_generation_prompt, **chat_template_args)`, and where
the template raises a TemplateError (templates that refuse a system role), once more without the system messages.

One deliberate difference: lm-eval renders with the tokenizer's default template whatever name was asked for, and
records the named one in results.json; raylm renders with the template it records.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from raylm.errors import RaylmError

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]


def template_sha(text: str) -> str:
    """lm-eval's hash_string: what results.json records as chat_template_sha and system_instruction_sha."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def select_template(tokenizer, name: str | None) -> str:
    """The template source a run uses: lm-eval's choice, with a one-line error where lm-eval raises or has none."""
    where = getattr(tokenizer, "name_or_path", "")
    templates = getattr(tokenizer, "chat_template", None)
    if not templates:
        raise RaylmError(f"--apply-chat-template: the tokenizer of '{where}' has no chat template "
                         "(chat_template in tokenizer_config.json or chat_template.jinja)")
    if isinstance(templates, dict):
        wanted = name if name is not None else "default"
        if wanted not in templates:
            why = "has no template named" if name is not None else "has several templates and none named"
            raise RaylmError(f"--apply-chat-template: the tokenizer of '{where}' {why} {wanted!r} "
                             f"(it has {', '.join(sorted(templates))})")
        return templates[wanted]
    if name is not None:
        log.warning("--apply-chat-template %s: the tokenizer of '%s' has a single chat template, which is used "
                    "(as lm-eval does)", name, where)
    return templates


class ChatTemplate:
    """HFLM.apply_chat_template for one tokenizer and template, as the callable lm-eval's tasks are handed."""

    def __init__(self, tokenizer, name: str | None = None, args: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.name = name
        self.source = select_template(tokenizer, name)
        self.args = dict(args or {})
        if "chat_template" in self.args:
            raise RaylmError("chat_template_args may not hold chat_template: name the template with "
                             "--apply-chat-template NAME")

    @property
    def sha(self) -> str:
        return template_sha(self.source)

    def __call__(self, chat_history: Messages, add_generation_prompt: bool = True) -> str:
        import jinja2

        try:
            return self._render(chat_history, add_generation_prompt)
        except jinja2.exceptions.TemplateError:
            log.warning("the chat template failed on these messages; retrying without the system role (as lm-eval "
                        "does)")
            return self._render([m for m in chat_history if m["role"] != "system"], add_generation_prompt)

    def _render(self, chat_history: Messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(chat_history, chat_template=self.source, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt, **self.args)
