"""Multi-process training: DDP gradients, sharded data order, torchrun end to end, precision."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from captioner.training import distributed
from captioner.model.config import ModelConfig
from captioner.errors import CaptionerError
from captioner.model.captioner import Captioner
from captioner.vocab import Vocabulary

ROOT = Path(__file__).resolve().parents[1]
VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])
B, L = 8, 9  # captions in the whole batch, annotation locations


def tiny_model() -> Captioner:
    torch.manual_seed(0)
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, hidden_dim=32, embed_dim=16, attention_dim=16,
                      dropout=0.0)
    model = Captioner(cfg, VOCAB)
    model.encoder.requires_grad_(False)  # fed cached annotations: the encoder takes no part
    return model


def tiny_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Annotations (B, L, C) and captions that all have 6 words, so each half holds the same number of words."""
    g = torch.Generator().manual_seed(1)
    annotations = torch.randn(B, L, 128, generator=g)  # (B, L, C)
    words = torch.randint(4, len(VOCAB), (B, 6), generator=g)
    captions = torch.cat([torch.full((B, 1), VOCAB.start_index), words, torch.full((B, 1), VOCAB.end_index)], 1)
    return annotations, captions, torch.full((B,), captions.shape[1])


def gradients(model: torch.nn.Module, annotations, captions, lengths) -> dict[str, torch.Tensor]:
    from captioner.training.losses import caption_loss

    out = model(annotations, captions, lengths)
    loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0)
    loss.backward()
    core = getattr(model, "module", model)
    return {k: p.grad.clone() for k, p in core.named_parameters() if p.grad is not None}


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    env = distributed.DistEnv(rank=rank, world=world)
    model = distributed.wrap_ddp(tiny_model(), env)
    annotations, captions, lengths = tiny_batch()
    part = slice(rank * B // world, (rank + 1) * B // world)
    grads = gradients(model, annotations[part], captions[part], lengths[part])
    stats = distributed.reduce_stats(env, {"loss": float(rank), "captions_per_s": 10.0})
    torch.save({"grads": grads, "stats": stats}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.integration
def test_ddp_first_step_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    expected = gradients(tiny_model(), *tiny_batch())
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert result["grads"].keys() == expected.keys() and len(expected) > 10
        for name, grad in expected.items():
            torch.testing.assert_close(result["grads"][name], grad, rtol=1e-5, atol=1e-6, msg=name)
        assert result["stats"] == {"loss": 0.5, "captions_per_s": 20.0}  # mean loss, summed throughput


@pytest.mark.parametrize("world", [1, 2, 3])
def test_epoch_sampler_deals_every_sample_and_resumes_mid_epoch(world):
    n = 23
    samplers = [distributed.EpochSampler(n, rank, world, seed=4) for rank in range(world)]
    for s in samplers:
        s.set_epoch(2)
    shares = [list(s) for s in samplers]
    assert {len(share) for share in shares} == {len(samplers[0])}  # same step count on every rank
    full = samplers[0].order()
    assert sorted(set(sum(shares, []))) == list(range(n))
    assert full == torch.randperm(n, generator=torch.Generator().manual_seed(4 * 1000 + 2)).tolist()
    # after k steps of batch 2 on every rank, the rest is what an uninterrupted epoch would still deal out
    k, batch = 2, 2
    for s in samplers:
        s.set_epoch(2, consumed=k * batch * world)
    for rank, s in enumerate(samplers):
        assert list(s) == shares[rank][k * batch:]
    samplers[0].set_epoch(3)
    assert samplers[0].order() != full


def test_bf16_autocast_trains_on_cpu():
    from captioner.training import LoopSettings, Precision, train_one_epoch

    model = tiny_model()
    annotations, captions, lengths = tiny_batch()
    loader = [{"inputs": annotations, "captions": captions, "lengths": lengths}] * 2
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = model.decoder.init_h.weight.clone() if hasattr(model.decoder, "init_h") else None
    steps = []
    settings = LoopSettings(lambda_ds=1.0, grad_clip=5.0, progress=False,
                            precision=Precision("bf16", torch.device("cpu")))
    stats = train_one_epoch(model, loader, optimizer, settings, on_step=lambda done: steps.append(done) or False)
    assert steps == [1, 2] and torch.isfinite(torch.tensor(stats["loss"]))
    if before is not None:
        assert not torch.equal(before, model.decoder.init_h.weight)
    with pytest.raises(CaptionerError, match="fp16 needs a CUDA"):
        Precision("fp16", torch.device("cpu"))


@pytest.mark.parametrize("extra", [[], ["--group-by-image"]], ids=["captions", "whole_images"])
@pytest.mark.integration
def test_torchrun_two_cpu_processes_train_and_write_one_checkpoint(tmp_path, shapes_json, extra):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           "--dataset", str(shapes_json), "--encoder", "small_cnn", "--encoder-weights", "none", "--embed-dim", "16",
           "--hidden-dim", "32", "--attention-dim", "16", "--max-train-images", "8", "--max-val-images", "2",
           "--batch-size", "8", "--epochs", "1", "--min-word-count", "1", "--device", "cpu", "--test-splits", "test",
           "--test-beam-size", "1", "--no-progress", "--threads", "1", "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("epoch 1:") == 1  # printed by rank 0 only
    assert (out / "config.json").is_file() and (out / "results_test.json").is_file()
    assert [p.name for p in out.glob("last-*")] == [(out / "last").resolve().name]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    state = torch.load(out / "last" / "train_state.pt", weights_only=True)
    assert state["world"] == 2 and len(state["ranks"]) == 2
    assert state["global_step"] == 3  # 40 captions / (8 per rank * 2 ranks), rounded up
