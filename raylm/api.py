"""raylm's actors under lm-eval's Python API: an `lm_eval.api.model.LM` whose likelihoods and generations run on Ray.

    import lm_eval
    from raylm import RayLM

    with RayLM(pretrained="EleutherAI/pythia-160m", actors=4) as lm:
        results = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy", "mmlu"])

`from raylm import RayLM` imports this module, which also registers the class as lm-eval's model "raylm", so
`simple_evaluate(model="raylm", model_args="pretrained=...,actors=4")` works too. Everything but the model calls
stays lm-eval's (task loading, prompts, gen_kwargs, metrics); the calls are tokenised as HFLM tokenises them, cut
into shards and run by model-resident actors, surviving dead actors as `raylm eval` does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lm_eval.models  # noqa: F401  (fills lm-eval's model registry first: see below)
import pyarrow as pa
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from raylm.cluster.runtime import LaunchedActors, connect, local_cpus_needed, plan_actors
from raylm.cluster.scheduler import score_shards
from raylm.config import parse_batch_size
from raylm.errors import RaylmError
from raylm.models.chat import ChatTemplate
from raylm.models.context import context_length
from raylm.models.identity import pin_revision, scored_commit
from raylm.models.loading import load_config, load_generation_config, load_tokenizer, resolve_scorer
from raylm.models.spec import ModelSpec, check_model_path
from raylm.requests.encoding import Encoder
from raylm.requests.generation import ModelSampling, generation_table, is_generation
from raylm.requests.lmeval import describe_problems, request_table
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS, LMEVAL_KIND, make_shards
from raylm.requests.table import warn_truncated
from raylm.tasks.lmeval.build import Request


# lm-eval's get_model() imports lm_eval.models (which registers "hf" and the rest) only while its registry is
# empty; registering "raylm" into an empty registry would leave every other model name unknown. Hence the import
# of lm_eval.models above, before this decorator runs.
@register_model("raylm")
class RayLM(LM):
    """Model-resident raylm actors as an lm-eval model. The actors start with the object and stay until close()
    (or the end of a `with` block, or of the Ray session)."""

    def __init__(self, pretrained: str, actors: int | None = None, dtype: str = "auto", device: str | None = None,
                 revision: str | None = None, trust_remote_code: bool = False, allow_pickle: bool = False,
                 batch_size: int | str | None = None, shard_size: int = DEFAULT_SHARD_REQUESTS,
                 num_gpus: float | None = None, load_in_4bit: bool = False, load_in_8bit: bool = False,
                 max_length: int | None = None, peft: str | None = None, add_bos_token: bool | None = None,
                 prefix_token_id: int | None = None, chat_template_args: dict[str, Any] | None = None,
                 enable_thinking: bool | None = None, progress: bool = False) -> None:
        super().__init__()
        quantization = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
        spec = ModelSpec(
            str(pretrained), dtype, device or "auto", revision, trust_remote_code, allow_pickle, quantization,
            max_length=int(max_length) if max_length is not None else None, peft=peft, add_bos_token=add_bos_token,
            prefix_token_id=int(prefix_token_id) if prefix_token_id is not None else None)
        if enable_thinking:
            raise RaylmError("enable_thinking=True is not compatible with loglikelihood tasks (HFLM refuses it too)")
        spec.validate()
        check_model_path(spec)
        self.revision = revision
        # One commit of a hub model for the driver's tokenizer, every actor and every replacement actor, however
        # long the object lives and wherever `main` moves meanwhile.
        self.spec = pin_revision(spec)
        if shard_size < 1:
            raise RaylmError(f"shard_size must be at least 1, got {shard_size}")
        self.shard_size, self.progress = shard_size, progress
        config = load_config(self.spec)
        if resolve_scorer(self.spec, config) == "mlm":
            raise RaylmError(f"'{pretrained}' is a masked LM: RayLM scores causal LMs; score masked LMs on lm-eval's "
                             "tasks with `raylm eval --model ... --tasks ...`")
        self.tokenizer = load_tokenizer(self.spec)
        try:
            self.encoder = Encoder(self.tokenizer, context_length(self.spec, config, "causal", self.tokenizer),
                                   self.spec.add_bos_token, self.spec.prefix_token_id)
        except ValueError as e:
            raise RaylmError(str(e)) from e
        # HFLM's: chat_template_args with enable_thinking folded in (True is refused above).
        self.chat_template_args = {**(chat_template_args or {}),
                                   **({} if enable_thinking is None else {"enable_thinking": enable_thinking})}
        self._templates: dict[str | None, ChatTemplate] = {}
        # simple_evaluate names a model object by model.config._name_or_path, as HFLM's config has it.
        self.config = SimpleNamespace(_name_or_path=str(pretrained))
        connect(min_cpus=local_cpus_needed(actors))
        recipe, n = plan_actors(self.spec, actors, parse_batch_size(batch_size), num_gpus)
        self._launched = LaunchedActors(recipe, n)
        self._ready = False
        self._sampling: ModelSampling | None = None  # the model's generation defaults, read on the first generation

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    @property
    def eot_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.encoder.prefix_token

    @property
    def tokenizer_name(self) -> str:
        """HFLM's: what lm-eval keys its request cache by when a chat template is applied."""
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The template lm-eval records in results.json (HFLM's choice: named, or the tokenizer's default)."""
        if chat_template is False or chat_template is None:
            return None
        return self._template(None if chat_template is True else chat_template).source

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """HFLM.apply_chat_template: the tokenizer's default template, with chat_template_args."""
        return self._template(None)(chat_history, add_generation_prompt)

    def _template(self, name: str | None) -> ChatTemplate:
        if name not in self._templates:
            self._templates[name] = ChatTemplate(self.tokenizer, name, self.chat_template_args)
        return self._templates[name]

    def get_model_info(self) -> dict[str, Any]:
        """What HFLM.get_model_info adds to results' config, as far as the driver knows it (no weights here): the
        revision as asked, and the commits every actor loaded."""
        info: dict[str, Any] = {"model_dtype": self.spec.dtype}
        if self.revision is not None:
            info["model_revision"] = self.revision
        commit = scored_commit(self.spec)
        if commit:
            info["model_sha"] = commit
        if self.spec.peft_revision:
            info["peft_sha"] = self.spec.peft_revision
        return info

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        """(summed log-probability of the continuation, whether it is the greedy decode) per (context,
        continuation) request, in request order."""
        scored = self._score(requests)
        return [(float(ll), bool(greedy)) for ll, greedy in zip(scored["loglikelihood"].to_pylist(),
                                                               scored["is_greedy"].to_pylist())]

    def loglikelihood_rolling(self, requests: list[Instance]) -> list[float]:
        """Each text's summed log-probability over its rolling windows, a bare float as HFLM returns it."""
        scored = self._score(requests)
        totals = [0.0] * len(requests)
        for position, ll in zip(scored["req_idx"].to_pylist(), scored["loglikelihood"].to_pylist()):
            totals[position] += ll
        return totals

    def generate_until(self, requests: list[Instance]) -> list[str]:
        """Each request's generated text, in request order. lm-eval sends a request `repeats` times (the same
        Instance): its sends are its repeats, each sampled from its own seed (raylm.requests.generation), drawn
        from the torch seed simple_evaluate set, as `raylm eval` draws them from its own."""
        import torch

        first: dict[int, int] = {}  # id(Instance) -> its place among the distinct requests
        distinct: list[Instance] = []
        sends: list[tuple[int, int]] = []  # (distinct request, repeat) per position
        counts: list[int] = []
        for inst in requests:
            k = first.setdefault(id(inst), len(distinct))
            if k == len(distinct):
                distinct.append(inst)
                counts.append(0)
            sends.append((k, counts[k]))
            counts[k] += 1
        rows = [Request(str(inst.task_name), inst.doc_id, inst.idx, inst.request_type, inst.args, n)
                for inst, n in zip(distinct, counts)]
        if self._sampling is None:
            self._sampling = ModelSampling.of(load_generation_config(self.spec), self.spec.path)
        table, cut = generation_table(rows, self.encoder, self._sampling, torch.initial_seed(),
                                      keys=list(zip(self._groups(distinct), range(len(distinct)))))
        warn_truncated("lm-eval requests", cut, self.max_length)
        if table.num_rows == 0:
            return []
        scored = self._run(table)
        texts = dict(zip(zip(scored["req_idx"].to_pylist(), scored["repeat"].to_pylist()),
                         scored["generation"].to_pylist()))
        return [texts[send] for send in sends]

    def close(self) -> None:
        """Stop the actors."""
        self._launched.release()

    def __enter__(self) -> RayLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _groups(requests: list[Instance]) -> list[int]:
        """A number per request that consecutive requests of one document share: shards never split a document,
        and its shared prompt is run once."""
        groups, group, previous = [], -1, None
        for inst in requests:
            if (inst.task_name, inst.doc_id) != previous:
                group, previous = group + 1, (inst.task_name, inst.doc_id)
            groups.append(group)
        return groups

    def _score(self, requests: list[Instance]) -> pa.Table:
        """Score requests on the actors; rows come back sorted by request position (then window)."""
        rows = [Request(str(inst.task_name), group, position, inst.request_type, inst.args)
                for position, (inst, group) in enumerate(zip(requests, self._groups(requests)))]
        table, problems = request_table(rows, self.encoder)
        if problems:
            where = [(str(requests[r.idx].task_name), requests[r.idx].doc_id, requests[r.idx].idx, why, n)
                     for r, why, n in problems]
            raise RaylmError(describe_problems(where, self.max_length))
        if table.num_rows == 0:
            return table.append_column("loglikelihood", pa.array([], pa.float64())).append_column(
                "is_greedy", pa.array([], pa.bool_()))
        return self._run(table)

    def _run(self, table: pa.Table) -> pa.Table:
        """A request table run on the actors; rows come back sorted by request position (then window or
        repeat)."""
        shards = make_shards({"lm-eval requests": (LMEVAL_KIND, table)}, self.shard_size)
        actors = self._launched.wait_ready() if not self._ready else self._launched.actors
        self._ready = True
        report = score_shards(actors, self._launched.recipe, shards, self.progress)
        then = "repeat" if is_generation(table) else "window"
        return pa.concat_tables(r.table for r in report.results).sort_by(
            [("req_idx", "ascending"), (then, "ascending")])
