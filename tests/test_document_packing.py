"""`--packing documents`: several documents share a row, and none of them sees another.

A packed row carries position ids restarting at each document and no attention mask; the
model families trainwise allows must then keep attention inside each document, the loss
must be the token-weighted loss of the documents run one by one, and the estimate must
trace the document mask it costs."""

from __future__ import annotations

import pytest
import torch

from memory_reference import measure_step
from trainwise.api import estimate
from trainwise.cli.main import main
from trainwise.engine.data.packing import IGNORE_INDEX, causal_lm_batch
from trainwise.engine.data.tokens import BYTE_EOS, ByteTokenizer
from trainwise.models import build_model, resolve_model
from trainwise.models.documents import DOCUMENT_MASK_FAMILIES, attend_within_documents
from trainwise.plan.plan import Plan
from trainwise.techniques import build_optimizer, compute_loss, precision_policy, prepare_model

TEXTS = ("Packing keeps rows full.", "Each document attends to itself.", "No padding, no leaks!")
LOSS_TOLERANCE = 1e-5  # relative, fp32: one packed row against the documents one by one
CURVE_TOLERANCE = 1e-4  # relative, fp32, each of 20 steps: same math, summed in another order
PEAK_TOLERANCE = 0.03


def _model(name: str, attention: str, packing: str = "documents") -> torch.nn.Module:
    """A catalog model with the step recipe applied, dropout off (eval) so runs compare."""
    torch.manual_seed(0)
    plan = Plan(device="cpu", attention=attention, packing=packing)
    model = prepare_model(build_model(resolve_model(name), "cpu", attention=attention), plan,
                          precision_policy("fp32", "cpu"), "causal-lm")
    return model.eval()


def _documents() -> list[torch.Tensor]:
    """TEXTS as byte tokens, each ending with the end-of-document id, as the data path makes them."""
    stream = ByteTokenizer().stream(list(TEXTS))
    ends = (stream == BYTE_EOS).nonzero().flatten().tolist()
    return [stream[start:end + 1] for start, end in zip([0] + [e + 1 for e in ends[:-1]], ends)]


def _packed(documents: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    row = torch.cat(documents)[None]
    return causal_lm_batch(row, torch.tensor([row.shape[1]]), with_mask=True, document_end=BYTE_EOS)


def test_positions_restart_at_each_document_and_each_row():
    ids = torch.tensor([[5, 6, BYTE_EOS, 7, 8, BYTE_EOS, 1, 2], [3, BYTE_EOS, 4, 0, 0, 0, 0, 0]])
    batch = causal_lm_batch(ids, torch.tensor([8, 3]), with_mask=True, document_end=BYTE_EOS)
    assert "attention_mask" not in batch  # its absence makes transformers read the documents
    # Row 1 opens mid-document (the stream was cut there): it restarts at 0. The padding of
    # row 2 is one more document.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 0, 0, 1, 2, 3, 4]]
    # Each document's first token is never a target (the previous document's end would
    # predict it); the end-of-document id stays a target; padding never is.
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, BYTE_EOS, IGNORE_INDEX, 8, BYTE_EOS, IGNORE_INDEX, 2],
                                        [IGNORE_INDEX, BYTE_EOS, IGNORE_INDEX] + [IGNORE_INDEX] * 5]


@pytest.mark.parametrize("name,attention", [("tiny-llama", "sdpa"), ("tiny-llama", "eager"), ("tiny-gpt2", "sdpa")])
def test_packed_row_loss_equals_the_documents_run_one_by_one(name, attention):
    model, documents = _model(name, attention), _documents()
    with torch.no_grad():
        packed = compute_loss(model, _packed(documents)).item()
        sums = [compute_loss(model, {"input_ids": d[None], "labels": d[None]}).item() * (len(d) - 1)
                for d in documents]
    alone = sum(sums) / sum(len(d) - 1 for d in documents)
    assert packed == pytest.approx(alone, rel=LOSS_TOLERANCE)


def _family_model(family: str, attention: str) -> torch.nn.Module:
    """A two-block model of `family` (catalog tiny models where there is one)."""
    catalog = {"llama": "tiny-llama", "gpt2": "tiny-gpt2", "mixtral": "tiny-mixtral"}
    if family in catalog:
        return _model(catalog[family], attention)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, vocab_size=300, hidden_size=64, intermediate_size=128, head_dim=16,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  attn_implementation=attention)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    attend_within_documents(model)  # what prepare_model does under --packing documents
    return model.eval()


@pytest.mark.parametrize("family", DOCUMENT_MASK_FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_no_token_attends_across_a_document_boundary(family, attention):
    """Changing the first document changes nothing the second one computes."""
    model = _family_model(family, attention)
    first, second = _documents()[:2]
    other_first = torch.flip(first[:-1], [0]).tolist() + [BYTE_EOS]
    with torch.no_grad():
        logits = [model(**{k: v for k, v in _packed([doc, second]).items() if k != "labels"}).logits[0, -len(second):]
                  for doc in (first, torch.tensor(other_first))]
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)


def test_stream_packing_does_attend_across_documents():
    """The default (--packing stream) is the contaminated one: the check above can fail."""
    model = _model("tiny-llama", "sdpa", packing="stream")
    first, second = _documents()[:2]
    with torch.no_grad():
        logits = [model(input_ids=torch.cat([doc, second])[None]).logits[0, -len(second):]
                  for doc in (first, torch.flip(first, [0]))]
    assert (logits[0] - logits[1]).abs().max() > 1e-3


def _segments(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The documents of a packed batch, cut where its position ids restart."""
    pieces = []
    for ids, positions in zip(batch["input_ids"], batch["position_ids"]):
        starts = (positions == 0).nonzero().flatten().tolist() + [len(ids)]
        pieces += [ids[a:b] for a, b in zip(starts, starts[1:])]
    return pieces


def _padded(pieces: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same documents unpacked: one padded row each, masked by attention_mask and -100."""
    width = max(len(p) for p in pieces)
    ids = torch.zeros(len(pieces), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, piece in enumerate(pieces):
        ids[row, :len(piece)], mask[row, :len(piece)] = piece, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE_INDEX)}


def _curve(batches: list[dict], packing: str) -> list[float]:
    plan = Plan(device="cpu", attention="sdpa", packing=packing, lr=1e-3, warmup_steps=0)
    model = _model("tiny-llama", "sdpa", packing).train()
    optimizer = build_optimizer(plan, model, "cpu")
    losses = []
    for batch in batches:
        loss = compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _random_stream(documents: int, seed: int = 0) -> torch.Tensor:
    """Byte documents of 6-30 tokens, each followed by the end-of-document id."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 31, (documents,), generator=generator).tolist()
    return torch.cat([torch.cat([torch.randint(0, 256, (n,), generator=generator), torch.tensor([BYTE_EOS])])
                      for n in lengths])


@pytest.mark.slow  # 40 optimizer steps: 5-35 s on a busy 2-core machine
def test_loss_curve_packed_with_document_masks_matches_the_documents_unpadded_over_20_steps():
    rows = _random_stream(documents=200)[:20 * 2 * 48].view(20, 2, 48)
    packed = [causal_lm_batch(r, torch.tensor([48, 48]), with_mask=True, document_end=BYTE_EOS) for r in rows]
    assert sum(len(_segments(b)) for b in packed) > 80  # several documents per row
    unpacked = [_padded(_segments(b)) for b in packed]
    packed_curve, unpacked_curve = _curve(packed, "documents"), _curve(unpacked, "stream")
    assert packed_curve == pytest.approx(unpacked_curve, rel=CURVE_TOLERANCE)
    assert packed_curve[-1] < packed_curve[0]  # it trains


@pytest.mark.slow
@pytest.mark.parametrize("name,knobs", [("tiny-llama", {}), ("tiny-llama", {"attention": "eager"}),
                                        ("tiny-llama", {"grad_ckpt": True}), ("tiny-gpt2", {})])
def test_estimate_peak_with_document_masks_within_3_percent_of_a_cpu_step(name, knobs):
    plan = Plan.from_dict({"batch_size": 4, "seq_len": 128, "device": "cpu", "packing": "documents", **knobs})
    spec = resolve_model(name)
    measured, predicted = measure_step(spec, plan), estimate(spec, plan).memory
    error = (predicted.peak_allocated - measured.peak_allocated) / measured.peak_allocated
    assert abs(error) < PEAK_TOLERANCE, f"predicted {predicted.peak_allocated:,} B, measured " \
                                        f"{measured.peak_allocated:,} B ({error:+.2%})"


REFUSED = {
    "masked-lm model": ("estimate", "tiny-bert", []),
    "seq2seq model": ("estimate", "tiny-t5", []),
    "flash with more than one row": ("estimate", "tiny-llama", ["--device", "H100", "--attention", "flash",
                                                                "--precision", "bf16", "--batch-size", "2"]),
    "pipeline stages": ("estimate", "tiny-llama", ["--device", "H100", "--pp", "2", "--nproc", "2"]),
    "train on a masked-lm model": ("train", "tiny-bert", ["--steps", "1", "--data", "synthetic"]),
}


@pytest.mark.fault
@pytest.mark.parametrize("case", REFUSED)
def test_packing_documents_is_refused_where_attention_would_cross_them(case, capsys, tmp_path, fault_log):
    command, model, flags = REFUSED[case]
    argv = [command, model, "--device", "cpu", "--seq-len", "16", "--batch-size", "1", "--packing", "documents",
            *flags]
    if command == "train":
        argv += ["--output", str(tmp_path / "out")]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("trainwise: error: --packing"), (code, err)
    assert not (tmp_path / "out").exists()
    fault_log(kind="bad input", case=f"{command} {model} --packing documents ({case})", exit_code=code,
              message=err[0])


@pytest.mark.fault
def test_a_tokenizer_without_an_end_of_document_id_cannot_pack_documents(tmp_path, fault_log):
    from test_data import _save_word_tokenizer, _write_corpus
    from trainwise.common.errors import InputError
    from trainwise.engine.data import build_data
    from trainwise.engine.run_config import RunConfig

    corpus = _write_corpus(tmp_path, "txt")
    tokenizer = _save_word_tokenizer(tmp_path / "tok", corpus, json_only=True)  # no eos, no sep
    plan = Plan(device="cpu", seq_len=16, packing="documents")
    with pytest.raises(InputError) as caught:
        build_data(RunConfig(data=str(corpus), tokenizer=str(tokenizer)), resolve_model("tiny-llama"), plan)
    assert caught.value.field == "--packing" and "eos" in str(caught.value)
    fault_log(kind="bad input", case="train --packing documents with a tokenizer that has no eos or sep id",
              exit_code=2, message=str(caught.value).replace(str(tmp_path), "DIR"))



@pytest.mark.parametrize("batch_size,kernel", [(1, "flash"), (2, "sdpa")])
def test_attention_auto_picks_a_kernel_that_keeps_documents_apart(batch_size, kernel):
    from trainwise.api.compatibility import check_request
    from trainwise.hardware import resolve_device

    plan = Plan(device="H100", attention="auto", precision="bf16", packing="documents", batch_size=batch_size)
    resolved, notes = check_request(plan, resolve_device("H100"), resolve_model("tiny-llama"), here=False)
    assert resolved.attention == kernel and f"picked {kernel}" in notes[0]
