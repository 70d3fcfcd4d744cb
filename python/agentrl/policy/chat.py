"""Chat prompts: messages to the token ids a policy generates the assistant's reply from.

A Hugging Face tokenizer with a chat template renders the messages with
``apply_chat_template(..., add_generation_prompt=True)``; the rendered text carries the
template's own special tokens, so it is encoded without adding more (as vLLM does). Any other
tokenizer (the built-in model's :class:`~agentrl.policy.CharTokenizer`, an HF tokenizer
without a template) uses :data:`SIMPLE_TEMPLATE`: each message as ``<|role|>\\n`` + content +
``\\n``, then ``<|assistant|>\\n``, encoded as a prompt (BOS first)::

    <|system|>
    Be brief.
    <|user|>
    2 + 2?
    <|assistant|>
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SIMPLE_TEMPLATE", "chat_prompt_ids", "render_simple"]

SIMPLE_TEMPLATE = "<|{role}|>\n{content}\n"
"""Format of one message in the simple template; the prompt ends with ``<|assistant|>\\n``."""


def render_simple(messages: Sequence[Mapping[str, str]]) -> str:
    """The simple template's text for ``messages`` (``role``/``content`` mappings)."""
    text = "".join(SIMPLE_TEMPLATE.format(role=m["role"], content=m["content"]) for m in messages)
    return text + "<|assistant|>\n"


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Prompt ids for ``messages`` (see the module docstring). Raises ``ValueError`` when the
    model's template refuses the conversation (e.g. roles that do not alternate)."""
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and getattr(hf, "chat_template", None):
        try:
            text = hf.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # jinja2's TemplateError (raise_exception in templates) & co
            raise ValueError(f"the model's chat template refused the messages: {e}") from e
        return list(hf(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer.encode_prompt(render_simple(messages)))
