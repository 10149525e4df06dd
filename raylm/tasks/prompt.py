"""A native task's requests under a system instruction or a chat template, as lm-eval 0.4.13 writes its own
hellaswag and winogrande then (ConfigurableTask.fewshot_context, build_qa_turn, multiple_input_context,
construct_requests; lm_eval/api/utils.py's Message and multiturn_to_singleturn).

lm-eval builds a prompt as messages, each with a delimiter used only in plain text: the system instruction (no
delimiter), every few-shot example as a user turn (its question, then the target delimiter " ") and an assistant
turn (its answer, then "\\n\\n"), and the evaluated question as a last user turn. Plain text is the messages'
contents and delimiters concatenated. Under a chat template the messages go to the template as they are
(`fewshot_as_multiturn`), or folded into one user turn holding that plain text (the system message kept apart),
and the continuation loses its leading delimiter: the template's generation prompt ends where the answer starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from raylm.tasks.base import FEWSHOT_DELIMITER, TARGET_DELIMITER, ChoiceDoc

ChatTemplate = Callable[..., str]  # (messages, add_generation_prompt=True) -> the prompt (raylm.models.chat)
Turn = tuple[str, str, str]  # (role, content, plain-text delimiter)


@dataclass(frozen=True)
class PromptFormat:
    system_instruction: str | None = None
    chat_template: ChatTemplate | None = None
    fewshot_as_multiturn: bool = False
    thinking: bool = False  # HFLM's enable_thinking=True: loglikelihood requests are refused, as HFLM refuses them

    @property
    def is_plain(self) -> bool:
        """lm-eval's default: the requests exactly as the task built them."""
        return not self.system_instruction and self.chat_template is None


PLAIN = PromptFormat()


def render(doc: ChoiceDoc, fmt: PromptFormat) -> ChoiceDoc:
    """The document's requests in this format (unchanged for PLAIN)."""
    if fmt.is_plain:
        return doc
    shared: list[Turn] = [("system", fmt.system_instruction, "")] if fmt.system_instruction else []
    for question, answer in doc.examples:
        shared += [("user", question, TARGET_DELIMITER), ("assistant", answer, FEWSHOT_DELIMITER)]
    prompts: dict[str, str] = {}  # HellaSwag's choices share one question: render it once
    for question in doc.questions:
        if question not in prompts:
            prompts[question] = _prompt([*shared, ("user", question, "")], fmt)
    delimiter = "" if fmt.chat_template is not None else TARGET_DELIMITER
    return replace(doc, contexts=tuple(prompts[q] for q in doc.questions),
                   continuations=tuple(delimiter + a for a in doc.answers))


def _prompt(turns: list[Turn], fmt: PromptFormat) -> str:
    if fmt.chat_template is None:
        return "".join(content + delimiter for _, content, delimiter in turns)
    if fmt.fewshot_as_multiturn:
        return fmt.chat_template([{"role": role, "content": content} for role, content, _ in turns])
    system = [{"role": "system", "content": turns[0][1]}] if turns[0][0] == "system" else []
    rest = turns[len(system):]
    # multiturn_to_singleturn: the last turn (the evaluated question) loses its delimiter, which is already "".
    single = "".join(content + delimiter for _, content, delimiter in rest[:-1]) + rest[-1][1]
    return fmt.chat_template([*system, {"role": "user", "content": single}])
