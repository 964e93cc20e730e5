"""--group-by-image: batches of whole images read each image once for all its captions, and compute what one copy
of the image per caption computes."""

import copy

import pytest
import torch

from captioner.data.karpathy import CaptionDataset, KarpathySplit, collate_captions
from captioner.training.distributed import EpochSampler
from captioner.training.losses import caption_loss
from captioner.scenes.training import object_mask_loss
from captioner.model.step_grad import StepReads
from captioner.vocab import Vocabulary
from test_decoder_speedpaths import caption_batch, paper_like

IMAGE_OF = torch.tensor([2, 0, 2, 2, 2, 0])  # of 3 images: 1 has no caption, 0 two, 2 four


@pytest.mark.parametrize("changes", [
    {}, {"score": "dot"}, {"value_projection": True, "score": "general"}, {"score": "cosine"},
    {"location": True, "score": "scaled_dot", "word_query": True, "positional": 4}, {"attention": "none"},
    {"attention": "hard"}, {"count_head": True, "count_mask": True}, {"score": "scaled_dot", "lookalike": 2},
    {"attention": "hard", "score": "scaled_dot", "location": True, "lookalike": 2}],
    ids=["additive", "dot", "value_projection", "cosine", "shapes_recipe", "no_attention", "hard", "count_mask",
         "lookalike", "hard_lookalike"])
@pytest.mark.parametrize("fine_tuned", [False, True], ids=["cached", "fine_tuned"])
def test_grouped_forward_equals_one_copy_per_caption(monkeypatch, changes, fine_tuned):
    """Logits, alphas and every gradient (parameters, and the annotations when the encoder is trained) equal
    those of the same batch with each caption's annotations repeated; soft attention takes the grouped reads."""
    from captioner.model import step_grad
    from captioner.model import teacher_forcing

    blocks = []
    real_block = step_grad.StepReads.block
    monkeypatch.setattr(step_grad.StepReads, "block", lambda self, x: blocks.append(1) or real_block(self, x))
    grouped = paper_like(**changes).train()
    if grouped.attention is not None and grouped.attention.score.location is not None:
        torch.nn.init.normal_(grouped.attention.score.location.weight)  # starts at zero: make the history count
    repeated = copy.deepcopy(grouped)
    _, captions, lengths = caption_batch()
    images = torch.randn(3, 9, 8, generator=torch.Generator().manual_seed(7))  # (N, L, C)
    results = []
    for model, rows in ((grouped, IMAGE_OF), (repeated, None)):
        leaf = images.clone().requires_grad_(fine_tuned)
        torch.manual_seed(3)  # hard attention samples: the same draws
        out = model(leaf, captions, lengths, image_of=rows) if rows is not None else \
            model(leaf[IMAGE_OF], captions, lengths)
        targets = None  # the count mask's boxes: random cells of the words
        if model.cfg.plugin_config.get("count_mask"):
            targets = (torch.rand(out.alphas.shape, generator=torch.Generator().manual_seed(1)) > 0.7).float()
        loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0, attention_targets=targets)
        if targets is not None:  # the count mask's supervision, as the scenes plug-in adds it in training
            loss = loss + object_mask_loss(out.extras["object_mask"], targets, out.mask)
        loss.backward()
        results.append((out, leaf.grad, [p.grad for p in model.parameters()]))
    (a, a_leaf, a_grads), (b, b_leaf, b_grads) = results
    # hard attention: a batch that drew the sampled context keeps the step loop (Decoder.forward)
    assert bool(blocks) == (teacher_forcing.supports(grouped) and grouped.attention is not None
                            and a.sample_log_probs is None)
    if grouped.cfg.plugin_config.get("count_mask"):
        assert torch.allclose(a.extras["object_mask"], b.extras["object_mask"], atol=1e-5)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert torch.allclose(a.alphas, b.alphas, atol=1e-6)
    assert torch.equal(a.mask, b.mask)
    if fine_tuned:
        assert torch.allclose(a_leaf, b_leaf, atol=1e-5, rtol=1e-4)
        assert float(a_leaf[1].abs().sum()) == 0 and float(a_leaf[2].abs().sum()) > 0  # image 1 has no caption
    for x, y in zip(a_grads, b_grads):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.allclose(x, y, atol=1e-5, rtol=1e-4)


def test_grouped_path_reads_each_image_once(monkeypatch):
    """The grouped reads run: one (N, G, .) product per read, over the N images, not B copies."""
    from captioner.model import step_grad

    seen = []
    real = step_grad.StepReads.block
    monkeypatch.setattr(step_grad.StepReads, "block", lambda self, x: seen.append(self.shape[0]) or real(self, x))
    model = paper_like(location=True, score="scaled_dot", word_query=True, positional=4).train()
    _, captions, lengths = caption_batch()
    out = model(torch.randn(3, 9, 8), captions, lengths, image_of=IMAGE_OF)
    caption_loss(out, captions[:, 1:])[0].backward()
    assert seen and set(seen) == {3}


@pytest.mark.parametrize("attention", ["hard", "soft"])
def test_initial_state_once_per_image(monkeypatch, attention):
    """The look-alike channels (one (L, L) product per row) run on the N images, not on a copy per caption, in
    the step loop of hard attention as in the grouped soft path."""
    from captioner.scenes.lookalike import LookAlike

    rows = []
    real = LookAlike.forward
    monkeypatch.setattr(LookAlike, "forward", lambda self, a: rows.append(a.shape[0]) or real(self, a))
    model = paper_like(attention=attention, score="scaled_dot", location=True, lookalike=2).train()
    _, captions, lengths = caption_batch()
    out = model(torch.randn(3, 9, 8), captions, lengths, image_of=IMAGE_OF)
    caption_loss(out, captions[:, 1:])[0].backward()
    assert rows == [3]


@pytest.mark.parametrize("image_of", [torch.arange(6), torch.tensor([0, 1, 2, 3, 4, 0])], ids=["identity", "one_pair"])
def test_batches_of_mostly_distinct_images_take_the_ungrouped_path(monkeypatch, image_of):
    """A random batch (a repeated image here and there) reads one row per caption: grouping would be slower."""
    from captioner.model import step_grad

    monkeypatch.setattr(step_grad.StepReads, "block", lambda self, x: pytest.fail("grouped path taken"))
    model = paper_like(score="dot").train()
    annotations, captions, lengths = caption_batch()
    out = model(annotations[: int(image_of.max()) + 1], captions, lengths, image_of=image_of)
    expected = model(annotations[: int(image_of.max()) + 1][image_of], captions, lengths)
    assert torch.allclose(out.logits, expected.logits, atol=1e-6)


@pytest.mark.parametrize("deferred", [True, False], ids=["source_needs_grad", "frozen_source"])
def test_grouped_step_reads_match_plain_autograd(deferred):
    """Reads of shrinking prefixes of rows, each row reading its own image: autograd's gradient of the same reads
    over one copy of the image per row."""
    g = torch.Generator().manual_seed(0)
    source = torch.randn(3, 7, 4, generator=g, requires_grad=deferred)  # (N, L, D)
    image_rows = torch.tensor([1, 0, 1, 1, 2])  # (B,)
    weights = [torch.randn(b, 7, generator=g, requires_grad=True) for b in (5, 4, 2)]
    queries = [torch.randn(b, 4, generator=g, requires_grad=True) for b in (5, 3, 1)]

    def loss(reads):
        total = sum((reads.weighted_sum(w) * (i + 1)).sum() for i, w in enumerate(weights))
        return total + sum((reads.dot(q) ** 2).sum() for q in queries)

    class Plain:
        def weighted_sum(self, w):
            return torch.bmm(w.unsqueeze(1), source[image_rows[: w.shape[0]]]).squeeze(1)

        def dot(self, q):
            return torch.bmm(source[image_rows[: q.shape[0]]], q.unsqueeze(-1)).squeeze(-1)

    leaves = ([source] if deferred else []) + weights + queries
    expected = torch.autograd.grad(loss(Plain()), leaves)
    got = torch.autograd.grad(loss(StepReads(source, image_rows)), leaves)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.fixture()
def shapes_train(shapes_json):
    split = KarpathySplit.load(shapes_json, "train")
    split.records = split.records[:4]
    return split, Vocabulary.build(split.all_tokens(), min_count=1)


def test_collate_stacks_each_image_once(shapes_train):
    split, vocab = shapes_train
    ds = CaptionDataset(split, vocab, lambda i: torch.full((2, 3), float(i)))
    items = [ds[k] for k in (0, 6, 1, 12, 7)]  # images 0, 1, 0, 2, 1 (5 captions per image)
    batch = collate_captions(items)
    assert batch["image_index"].tolist() == [0, 1, 0, 2, 1]
    assert batch["image_of"].tolist() == [0, 1, 0, 2, 1]
    assert batch["inputs"][:, 0, 0].tolist() == [0.0, 1.0, 2.0]  # (N, L, C) in order of first appearance
    assert torch.equal(batch["inputs"][batch["image_of"]], torch.stack([item[0] for item in items]))


def test_dataset_loads_an_image_once_for_its_consecutive_captions(shapes_train):
    split, vocab = shapes_train
    calls = []
    ds = CaptionDataset(split, vocab, lambda i: calls.append(i) or torch.zeros(1))
    for k in range(len(ds)):
        ds[k]
    assert calls == [0, 1, 2, 3]
    ds[0], ds[6], ds[1]
    assert calls[4:] == [0, 1, 0]


def test_epoch_sampler_keeps_groups_together_and_resumes(shapes_train):
    split, vocab = shapes_train
    groups = CaptionDataset(split, vocab, lambda i: torch.zeros(1)).image_groups()
    assert groups == [list(range(5 * i, 5 * i + 5)) for i in range(4)]
    sampler = EpochSampler(20, seed=0, groups=groups)
    orders = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(20))
        assert [order[i:i + 5] for i in range(0, 20, 5)] == [groups[order[i] // 5] for i in range(0, 20, 5)]
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1  # the image order changes with the epoch
    sampler.set_epoch(3, consumed=7)
    assert list(sampler) == orders[3][7:]
    with pytest.raises(ValueError, match="every position"):
        EpochSampler(20, groups=groups[:3])


def test_group_by_image_flags(tmp_path, capsys):
    from captioner.commands.train import cli
    from captioner.training.config import TrainConfig

    for flags, expected in (([], False), (["--group-by-image"], True), (["--no-group-by-image"], False)):
        assert cli(["--config", "shapes-hard", "--out", str(tmp_path / "r"), "--print-config", *flags]) == 0
        path = tmp_path / "printed.toml"
        path.write_text(capsys.readouterr().out)
        assert TrainConfig.from_recipe(path).optim.group_by_image is expected
    path.write_text(path.read_text().replace("group_by_image = false", "group_by_image = true"))
    assert cli(["--config", str(path), "--out", str(tmp_path / "r"), "--print-config", "--no-group-by-image"]) == 0
    assert "group_by_image = false" in capsys.readouterr().out


@pytest.mark.integration
def test_train_py_with_group_by_image(shapes_json, tmp_path):
    """End to end, with the encoder trained from images."""
    import json

    from test_train_cli import metrics_lines, train

    run = tmp_path / "grouped"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "2", "--group-by-image",
                   "--test-splits", "")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "group_by_image = true" in (run / "train_config.toml").read_text()
    lines = metrics_lines(run)
    assert len(lines) == 2 and all(line["train"]["loss"] == line["train"]["loss"] for line in lines)  # not NaN
    assert json.loads((run / "config.json").read_text())


def test_one_input_per_image_without_image_of_is_a_clear_error():
    model = paper_like().train()
    _, captions, lengths = caption_batch()
    with pytest.raises(ValueError, match="image_of"):
        model(torch.randn(3, 9, 8), captions, lengths)


def test_autocast_repeats_the_annotations_per_caption():
    """Under autocast the reads are plain autograd: image_of falls back to one row per caption, same outputs."""
    model = paper_like(score="dot").train()
    _, captions, lengths = caption_batch()
    images = torch.randn(3, 9, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = model(images, captions, lengths, image_of=IMAGE_OF)
        b = model(images[IMAGE_OF], captions, lengths)
    assert torch.equal(a.logits, b.logits)


def test_epoch_sampler_groups_under_two_ranks_and_without_shuffle(shapes_train):
    split, vocab = shapes_train
    groups = CaptionDataset(split, vocab, lambda i: torch.zeros(1)).image_groups()
    ranks = [list(EpochSampler(20, rank, 2, seed=0, groups=groups)) for rank in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(20)) and len(ranks[0]) == len(ranks[1]) == 10
    assert list(EpochSampler(20, shuffle=False, groups=groups)) == list(range(20))


@pytest.mark.integration
def test_resume_mid_epoch_refuses_another_grouping(shapes_json, tmp_path):
    """Another caption order would skip the wrong captions of the interrupted epoch: one line, nothing trained."""
    import signal

    from captioner.training import run_state
    from test_resume import run, train_cmd

    out = tmp_path / "run"
    proc = run(train_cmd(shapes_json, out), **{run_state.KILL_ENV: "7"})  # killed mid-epoch 2, saved at step 6
    assert proc.returncode == -signal.SIGKILL
    proc = run(train_cmd(shapes_json, out, "--resume", "--group-by-image"))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "group_by_image" in lines[0], proc.stderr[-2000:]


def test_epoch_sampler_deals_whole_batches_to_ranks(shapes_train):
    """torchrun: each rank's batch is a contiguous block of the grouped order (its images' captions together); the
    ranks cover the epoch once, run the same number of steps, and a resume picks up at the same step."""
    split, vocab = shapes_train
    groups = CaptionDataset(split, vocab, lambda i: torch.zeros(1)).image_groups()
    B, world = 4, 2
    whole = EpochSampler(20, seed=0, groups=groups)
    whole.set_epoch(1)
    order = list(whole)
    ranks = []
    for rank in range(world):
        sampler = EpochSampler(20, rank, world, seed=0, groups=groups, batch_size=B)
        sampler.set_epoch(1)
        ranks.append(list(sampler))
        assert len(ranks[-1]) == len(sampler) == 10
    assert ranks[0][:B] == order[:B] and ranks[1][:B] == order[B:2 * B]  # the first round: one block each
    assert ranks[0][B:2 * B] == order[2 * B:3 * B] and ranks[1][B:2 * B] == order[3 * B:4 * B]
    assert sorted(ranks[0] + ranks[1]) == list(range(20))
    for rank in range(world):  # a resume after one step (B * world positions) continues each rank's stream
        sampler = EpochSampler(20, rank, world, seed=0, groups=groups, batch_size=B)
        sampler.set_epoch(1, consumed=B * world)
        assert list(sampler) == ranks[rank][B:]
