"""Which scorer a model gets: masked LM or causal from its config, --scorer overriding it, checkpoints without a
trained masked-LM head refused, and --pll refused where it means nothing."""

from __future__ import annotations

import pytest
from transformers import (
    AutoConfig,
    BertConfig,
    BertModel,
    ElectraConfig,
    ElectraForPreTraining,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
)

from raylm.errors import RaylmError
from raylm.models.loading import load_model, masked_or_causal, resolve_scorer
from raylm.models.spec import ModelSpec
from raylm.requests.driver import driver_encoder
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder

SMALL = dict(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)


@pytest.mark.parametrize("config,kind", [
    (BertConfig(architectures=["BertForMaskedLM"]), "mlm"),  # bert-base-uncased
    (BertConfig(), "mlm"),  # a BERT saved without `architectures`
    (BertConfig(architectures=["BertLMHeadModel"], is_decoder=True), "causal"),
    (BertConfig(is_decoder=True), "causal"),
    (AutoConfig.for_model("roberta", architectures=["RobertaForMaskedLM"]), "mlm"),  # roberta-base
    (AutoConfig.for_model("roberta"), "mlm"),  # RoBERTa also has a ForCausalLM class: still an encoder
    (AutoConfig.for_model("roberta", architectures=["RobertaForCausalLM"]), "causal"),
    (AutoConfig.for_model("distilbert", architectures=["DistilBertForMaskedLM"]), "mlm"),
    (AutoConfig.for_model("deberta-v2"), "mlm"),
    (AutoConfig.for_model("modernbert", architectures=["ModernBertForMaskedLM"]), "mlm"),
    (GPT2Config(architectures=["GPT2LMHeadModel"]), "causal"),
    (LlamaConfig(), "causal"),
    (AutoConfig.for_model("bart"), "causal"),  # encoder-decoder: in both auto mappings, not a masked LM here
    (PretrainedConfig(architectures=["NewEncoderForMaskedLM"]), "mlm"),  # remote code: a type transformers lacks
    (PretrainedConfig(architectures=["NewDecoderForCausalLM"]), "causal"),
], ids=lambda v: v if isinstance(v, str) else f"{v.model_type or 'custom'}{v.architectures or ''}")
def test_masked_or_causal_from_the_config(config, kind):
    assert masked_or_causal(config) == kind


def test_scorer_option_overrides_the_config():
    bert, gpt2 = BertConfig(architectures=["BertForMaskedLM"]), GPT2Config()
    assert resolve_scorer(ModelSpec("m", scorer="causal"), bert) == "causal"
    assert resolve_scorer(ModelSpec("m", scorer="mlm"), gpt2) == "mlm"
    assert resolve_scorer(ModelSpec("m"), bert) == "mlm" and resolve_scorer(ModelSpec("m"), gpt2) == "causal"
    with pytest.raises(RaylmError, match="unknown scorer 'bidirectional'"):
        ModelSpec("m", scorer="bidirectional").validate()
    with pytest.raises(RaylmError, match="unknown PLL variant 'l2r'"):
        ModelSpec("m", pll="l2r").validate()


def test_driver_tokenises_for_the_scorer_it_resolves(tiny_bert, tiny_roberta, tiny_gpt2):
    assert isinstance(driver_encoder(ModelSpec(str(tiny_bert))), MaskedEncoder)
    assert isinstance(driver_encoder(ModelSpec(str(tiny_roberta))), MaskedEncoder)
    assert driver_encoder(ModelSpec(str(tiny_roberta))).max_length == 96  # not its 98 position embeddings
    assert isinstance(driver_encoder(ModelSpec(str(tiny_roberta), scorer="causal")), Encoder)
    assert isinstance(driver_encoder(ModelSpec(str(tiny_gpt2))), Encoder)
    with pytest.raises(RaylmError, match="neither a BOS nor an EOS"):  # BERT as causal, as the user asked
        driver_encoder(ModelSpec(str(tiny_bert), scorer="causal"))
    with pytest.raises(RaylmError, match="has no mask token"):
        driver_encoder(ModelSpec(str(tiny_gpt2), scorer="mlm"))
    with pytest.raises(RaylmError, match="--pll word-l2r applies to masked language models"):
        driver_encoder(ModelSpec(str(tiny_gpt2), pll="word-l2r"))


@pytest.mark.parametrize("make", [lambda: BertModel(BertConfig(**SMALL)),
                                  lambda: ElectraForPreTraining(ElectraConfig(**SMALL, embedding_size=16))],
                         ids=["bare BertModel", "ELECTRA discriminator"])
def test_checkpoint_without_a_masked_lm_head_is_refused(make, tmp_path):
    """The config says masked LM (the model type has a masked-LM class), so only the weights can tell."""
    make().save_pretrained(tmp_path)
    assert masked_or_causal(AutoConfig.from_pretrained(tmp_path)) == "mlm"
    with pytest.raises(RaylmError, match="holds no trained masked-LM head: .* would be random"):
        load_model(ModelSpec(str(tmp_path), device="cpu"), "mlm")


def test_masked_lm_loads_with_its_head(tiny_bert):
    model = load_model(ModelSpec(str(tiny_bert), device="cpu"), "mlm")
    assert type(model).__name__ == "BertForMaskedLM"


def test_lm_evals_python_api_refuses_a_masked_lm_in_one_line(tiny_bert):
    """RayLM tokenises as HFLM does, for causal LMs; a masked LM is pointed to `raylm eval` before any Ray work."""
    from raylm.api import RayLM

    with pytest.raises(RaylmError, match=r"is a masked LM: RayLM scores causal LMs"):
        RayLM(pretrained=str(tiny_bert))
