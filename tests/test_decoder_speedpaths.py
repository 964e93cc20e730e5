"""The decoder's fast paths compute what the simple ones did: beam selection, the chunked score, teacher forcing."""

import copy

import pytest
import torch

from captioner.decoding.search import _select, beam_search_nbest
from captioner.model.decoder import Decoder
from tests.flat_configs import configs

NEG = float("-inf")


def select_one_by_one(top_scores, top_ids, width, V, K, end):
    """The per-image loop the vectorised ``_select`` replaced (the reference)."""
    n = top_scores.shape[0]
    new_scores = torch.full((n, K), NEG, dtype=top_scores.dtype)
    new_src = torch.zeros(n, K, dtype=torch.long)
    new_words = torch.full((n, K), end, dtype=torch.long)
    ended = []
    for j in range(n):
        kept = 0
        for position, (s, idx) in enumerate(zip(top_scores[j].tolist(), top_ids[j].tolist())):
            if s == NEG or kept == K:
                break
            if idx % V == end:
                ended.append((j, position))
            else:
                new_scores[j, kept], new_src[j, kept], new_words[j, kept] = s, j * width + idx // V, idx % V
                kept += 1
    return new_scores, new_src, new_words, ended


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("width", [1, 3])
def test_vectorised_selection_equals_the_loop(seed, width):
    """Random candidate lists with many <end>s and -inf entries: the same beams, sources, words and endings."""
    g = torch.Generator().manual_seed(seed)
    n, K, V, end = 7, 3, 5, 2
    total = torch.randn(n, width * V, generator=g, dtype=torch.float64)
    total[torch.rand(n, width * V, generator=g) < 0.3] = NEG  # forbidden words and dead beams
    total[:, end::V] += 1.0  # <end> often among the best
    total[0] = NEG  # an image with no candidate left
    top_scores, top_ids = total.topk(min(2 * K, width * V), dim=-1)
    fast = _select(top_scores, top_ids, width, V, K, end)
    slow = select_one_by_one(top_scores, top_ids, width, V, K, end)
    for a, b in zip(fast[:3], slow[:3]):
        assert torch.equal(a, b)
    assert fast[3] == slow[3]


def paper_like(vocab: int = 11, seed: int = 0, **changes) -> Decoder:
    torch.manual_seed(seed)
    cfg, _ = configs(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=8, hidden_dim=24,
                     embed_dim=16, attention_dim=20, dropout=0.0, vocab_size=vocab, **changes)
    return Decoder.build(cfg)


@pytest.mark.parametrize("end_bias", [0.0, NEG])  # captions ending at different steps; every caption cut at max_len
def test_batched_beam_equals_one_at_a_time_random_decoder(end_bias):
    """An untrained decoder whose <end> is likely (many endings at different steps) or impossible."""
    decoder = paper_like().eval()
    with torch.no_grad():
        decoder.L_o.bias[2] = end_bias
    images = torch.randn(9, 9, 8, generator=torch.Generator().manual_seed(3))  # (B, L, C)
    batched = beam_search_nbest(decoder, images, 1, 2, beam_size=3, max_len=7)
    assert end_bias < 0 or len({len(h.words) for nbest in batched for h in nbest}) > 2
    for b in range(len(images)):
        alone = beam_search_nbest(decoder, images[b:b + 1], 1, 2, beam_size=3, max_len=7)[0]
        assert [h.words for h in alone] == [h.words for h in batched[b]]
        assert [h.log_prob for h in alone] == pytest.approx([h.log_prob for h in batched[b]], abs=1e-5)
        assert [h.ended for h in alone] == [h.ended for h in batched[b]]
        for x, y in zip(alone, batched[b]):
            assert torch.allclose(x.alphas, y.alphas, atol=1e-6)


def loop_forward(decoder: Decoder, annotations, captions, lengths, **kwargs):
    """``Decoder.forward`` through its step loop (the unoptimised path)."""
    from captioner.model import teacher_forcing

    supports = teacher_forcing.supports
    teacher_forcing.supports = lambda d: False
    try:
        return decoder(annotations, captions, lengths, **kwargs)
    finally:
        teacher_forcing.supports = supports


def caption_batch(B: int = 6, vocab: int = 11, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 3, 7, 9, 2, 5][:B])  # ties, a one-word caption, unsorted
    captions = torch.randint(4, vocab, (B, int(lengths.max())), generator=g)
    captions[:, 0] = 1
    for i, n in enumerate(lengths.tolist()):
        captions[i, n - 1], captions[i, n:] = 2, 0
    return torch.randn(B, 9, 8, generator=g), captions, lengths


@pytest.mark.parametrize("changes", [{}, {"word_query": True}, {"count_head": True}, {"deep_output": False},
                                     {"attention": "none"}, {"gate": False, "score": "dot"}, {"location": True},
                                     {"location": True, "score": "scaled_dot", "word_query": True, "positional": 4},
                                     {"count_head": True, "count_mask": True},
                                     {"count_head": True, "count_mask": True, "location": True, "score": "scaled_dot",
                                      "word_query": True, "positional": 4, "value_projection": True},
                                     {"location": True, "score": "scaled_dot", "word_query": True, "positional": 4,
                                      "lookalike": 2}],
                         ids=["paper", "word_query", "count_head", "no_deep_output", "no_attention", "dot",
                              "location", "shapes_recipe", "count_mask", "count_mask_recipe", "lookalike"])
@pytest.mark.parametrize("shrink_below", [0.75, 0.0, 1.0], ids=["shrink", "never_shrink", "always_shrink"])
def test_fast_teacher_forcing_equals_the_step_loop(monkeypatch, changes, shrink_below):
    """Same logits, alphas, object mask and gradients (dropout off) as the step-by-step forward."""
    from captioner.model import teacher_forcing
    from captioner.training.losses import caption_loss
    from captioner.scenes.training import object_mask_loss

    monkeypatch.setattr(teacher_forcing, "SHRINK_BELOW", shrink_below)
    fast = paper_like(**changes).train()
    if fast.attention is not None and fast.attention.score.location is not None:
        torch.nn.init.normal_(fast.attention.score.location.weight)  # starts at zero: make the history count
    assert teacher_forcing.supports(fast)
    slow = copy.deepcopy(fast)
    annotations, captions, lengths = caption_batch()
    out_fast = fast(annotations, captions, lengths)
    out_slow = loop_forward(slow, annotations, captions, lengths)
    assert torch.allclose(out_fast.logits, out_slow.logits, atol=1e-5)
    assert torch.allclose(out_fast.alphas, out_slow.alphas, atol=1e-6)
    assert torch.equal(out_fast.mask, out_slow.mask)
    assert float(out_fast.logits.detach()[~out_fast.mask].abs().sum()) == 0.0  # nothing past a caption's end
    count_mask = fast.cfg.plugin_config.get("count_mask", False)
    mask_fast, mask_slow = out_fast.extras.get("object_mask"), out_slow.extras.get("object_mask")
    assert (mask_fast is None) == (mask_slow is None) == (not count_mask)
    targets = None
    if count_mask:
        assert torch.allclose(mask_fast, mask_slow, atol=1e-5)
        targets = torch.rand(out_fast.alphas.shape, generator=torch.Generator().manual_seed(1)) > 0.7  # (B, T, L)
        targets = targets.float() * out_fast.mask.unsqueeze(-1)
    for model, out in ((fast, out_fast), (slow, out_slow)):
        loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0, attention_targets=targets)
        if targets is not None:  # the count mask's supervision, as the scenes plug-in adds it in training
            loss = loss + object_mask_loss(out.extras["object_mask"], targets, out.mask)
        loss.backward()
    for (name, a), b in zip(fast.named_parameters(), slow.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-4), name


HARD = [{"attention": "hard"},
        {"attention": "hard", "location": True, "score": "scaled_dot", "word_query": True, "positional": 4,
         "lookalike": 2, "count_head": True}]


@pytest.mark.parametrize("fine_tuned", [False, True], ids=["cached", "fine_tuned"])
@pytest.mark.parametrize("sample_prob", [0.0, 1.0], ids=["expected", "sampled"])
@pytest.mark.parametrize("changes", HARD, ids=["paper", "shapes_recipe"])
def test_fast_teacher_forcing_of_hard_attention_equals_the_step_loop(monkeypatch, changes, sample_prob, fine_tuned):
    """Hard attention: the same logits, alphas, sampled log alpha, entropy and gradients (the REINFORCE term's and
    the entropy bonus's included, and the annotations' for a fine-tuned encoder) as the step loop. Shrinking at
    every step makes the fast pass step exactly the loop's rows, so both draw the same locations."""
    from captioner.model import teacher_forcing
    from captioner.training.losses import HardAttentionObjective, caption_loss

    monkeypatch.setattr(teacher_forcing, "SHRINK_BELOW", 1.0)
    fast = paper_like(**changes).train()
    if fast.attention.score.location is not None:
        torch.nn.init.normal_(fast.attention.score.location.weight)
    slow = copy.deepcopy(fast)
    annotations, captions, lengths = caption_batch()
    outs, grads = [], []
    def fast_forward(*a):  # Decoder.forward's draw, then the fast pass whichever the draw (forward would route a
        use_sample = bool(torch.rand(()) < sample_prob)  # sampled batch to the step loop: the test below)
        return teacher_forcing.teacher_forced(fast, *a, None, use_sample)

    for model, forward in ((fast, fast_forward),
                           (slow, lambda *a: loop_forward(slow, *a, sample_prob=sample_prob))):
        leaf = annotations.clone().requires_grad_(fine_tuned)
        torch.manual_seed(5)
        out = forward(leaf, captions, lengths)
        loss, parts = caption_loss(out, captions[:, 1:], lambda_ds=1.0, hard=HardAttentionObjective(baseline=-3.0))
        assert ("reinforce" in parts) == (sample_prob == 1.0) and "entropy" in parts
        loss.backward()
        outs.append(out)
        grads.append([leaf.grad] + [p.grad for p in model.parameters()])
    out_fast, out_slow = outs
    assert torch.allclose(out_fast.logits, out_slow.logits, atol=1e-5)
    assert torch.allclose(out_fast.alphas, out_slow.alphas, atol=1e-6)
    assert torch.allclose(out_fast.entropy, out_slow.entropy, atol=1e-5)
    assert float(out_fast.entropy.detach()[~out_fast.mask].abs().sum()) == 0.0
    if sample_prob:
        assert torch.allclose(out_fast.sample_log_probs, out_slow.sample_log_probs, atol=1e-5)
        assert float(out_fast.sample_log_probs.detach()[out_fast.mask].abs().sum()) > 0
    else:
        assert out_fast.sample_log_probs is None and out_slow.sample_log_probs is None
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert (grads[0][0] is not None) == fine_tuned


def test_hard_attention_batches_of_sampled_contexts_keep_the_step_loop(monkeypatch):
    """Decoder.forward sends a hard-attention batch to the fast pass only when it drew the expected context (the
    sampled one was slower there: experiments/hard_training_paths.py)."""
    from captioner.model import teacher_forcing

    calls, real = [], teacher_forcing.teacher_forced
    monkeypatch.setattr(teacher_forcing, "teacher_forced", lambda *a, **k: calls.append(1) or real(*a, **k))
    decoder = paper_like(attention="hard").train()
    annotations, captions, lengths = caption_batch()
    assert decoder(annotations, captions, lengths, sample_prob=1.0).sample_log_probs is not None and not calls
    assert decoder(annotations, captions, lengths, sample_prob=0.0).sample_log_probs is None and calls == [1]


def test_a_sampled_location_read_through_step_reads_is_the_plain_pick():
    """``_pick`` of values read through StepReads (grouped rows too): the same annotation and the same gradient."""
    from captioner.model.attention import SpatialAttention
    from captioner.model.step_grad import StepReads

    g = torch.Generator().manual_seed(0)
    source = torch.randn(3, 7, 4, generator=g, requires_grad=True)
    index = torch.tensor([6, 0, 3, 3, 1])
    image_rows = torch.tensor([0, 0, 2, 1, 2])
    weights = torch.randn(5, 4, generator=g)
    plain = (source[image_rows, index] * weights).sum()
    expected = torch.autograd.grad(plain, source)[0]
    for reads, rows in ((StepReads(source[image_rows] * 1.0), None), (StepReads(source, image_rows), image_rows)):
        picked = SpatialAttention._pick(reads, index, 1)  # (5, 4)
        assert torch.allclose(picked, source[image_rows, index])
        got = torch.autograd.grad((picked * weights).sum(), source)[0]
        assert torch.allclose(got, expected, atol=1e-6), rows


def test_step_loop_kept_for_channels_and_evaluation():
    from captioner.model import teacher_forcing

    assert teacher_forcing.supports(paper_like().train())
    assert teacher_forcing.supports(paper_like(location=True).train())
    assert not teacher_forcing.supports(paper_like(channel_attention=True).train())
    assert teacher_forcing.supports(paper_like(count_head=True, count_mask=True).train())
    assert teacher_forcing.supports(paper_like(attention="hard").train())
    assert not teacher_forcing.supports(paper_like().eval())
    with torch.no_grad():
        assert not teacher_forcing.supports(paper_like().train())


@pytest.mark.parametrize("location", [False, True])
def test_chunked_additive_score_equals_the_full_one(monkeypatch, location):
    """Inference computes the additive score a few rows at a time; the values are those of the one-tensor path."""
    from captioner.model import attention

    torch.manual_seed(0)
    score = attention.AttentionScore("additive", 8, 12, 16, location_grid=3 if location else 0)
    if location:
        torch.nn.init.normal_(score.location.weight)  # starts at zero: make the history count
    keys = torch.randn(7, 9, 16)  # (B, L, A)
    query = torch.randn(7, 12)
    history = torch.rand(7, 2, 9) if location else None
    full = score(keys, query, history).detach()  # grad enabled: the one-tensor path
    monkeypatch.setattr(attention, "CHUNK_ELEMENTS", 300)  # 2 rows of 9 x 16 per chunk: 4 chunks
    with torch.no_grad():
        chunked = score(keys, query, history)
    assert chunked.shape == (7, 9)
    assert torch.allclose(chunked, full, atol=1e-5)


def test_training_tanh_matches_torch_tanh_and_its_gradient():
    from captioner.model.attention import _tanh_

    x = (torch.randn(5, 7, 11, dtype=torch.float32) * 3).requires_grad_()
    y = _tanh_(x * 1.0)
    weights = torch.randn(5, 7, 11)
    (grad,) = torch.autograd.grad((y * weights).sum(), x)
    x_ref = x.detach().clone().requires_grad_()
    (grad_ref,) = torch.autograd.grad((torch.tanh(x_ref) * weights).sum(), x_ref)
    assert torch.allclose(y, torch.tanh(x), atol=1e-6)
    assert torch.allclose(grad, grad_ref, atol=1e-5)
    assert torch.autograd.gradcheck(lambda v: _tanh_(v * 1.0), torch.randn(3, 4, dtype=torch.float64,
                                                                               requires_grad=True))


@pytest.mark.parametrize("changes", [
    {}, {"location": True}, {"score": "additive", "location": True}, {"score": "dot"}, {"score": "general"},
    {"score": "cosine", "location": True}, {"attention": "hard"}, {"attention": "hard", "hard_inference": "argmax"},
    {"channel_attention": True}, {"count_head": True, "count_mask": True, "word_query": True},
    {"attention": "none"}, {"value_projection": True, "gate": False}],
    ids=["paper", "location", "additive_location", "dot", "general", "cosine_location", "hard", "hard_argmax",
         "channel", "count_mask", "no_attention", "value_projection"])
@pytest.mark.parametrize("chunk", [None, 40], ids=["one_tensor", "chunked"])
def test_grouped_beams_step_like_copied_rows(monkeypatch, changes, chunk):
    """Beam search keeps one copy of an image's keys and values for its K beams (State.group). Three steps from
    such a state give the logits, alphas and states of the same rows with every image's tensors copied per row."""
    from captioner.model import attention

    if chunk is not None:
        monkeypatch.setattr(attention, "CHUNK_ELEMENTS", chunk)  # the additive score in chunks of images
    decoder = paper_like(**changes).eval()
    if decoder.attention is not None and decoder.attention.score.location is not None:
        torch.nn.init.normal_(decoder.attention.score.location.weight)  # starts at zero: make the history count
    g = torch.Generator().manual_seed(5)
    n, K = 4, 3
    images = torch.randn(n, 9, 8, generator=g)  # (n, L, C)
    with torch.no_grad():
        first = decoder.init_state(images)  # one row per image
        rows = torch.arange(n).repeat_interleave(K)  # (n K,) each image's K beams
        grouped = first.regroup(rows, None, K)
        copied = first.index(rows)
        for t in range(3):
            words = torch.randint(3, 11, (n * K,), generator=g)
            a = decoder.step(words, grouped)
            b = decoder.step(words, copied)
            assert torch.allclose(a[0], b[0], atol=1e-5)  # logits
            assert torch.allclose(a[2], b[2], atol=1e-6)  # alphas
            grouped, copied = a[1], b[1]
            assert grouped.group == K and grouped.keys.shape[0] == n and copied.keys.shape[0] == n * K
            assert torch.allclose(grouped.h, copied.h, atol=1e-5)
            perm = torch.tensor([2, 0, 1, 3, 4, 5, 8, 8, 6, 11, 9, 10])  # beams swap within their image
            grouped, copied = grouped.reorder_beams(perm), copied.reorder_beams(perm)
        keep = torch.tensor([0, 2])  # images 1 and 3 finish
        rows = torch.tensor([0, 1, 2, 6, 7, 8])
        grouped, copied = grouped.regroup(rows, keep, K), copied.index(rows)
        a, b = decoder.step(torch.full((6,), 4), grouped), decoder.step(torch.full((6,), 4), copied)
        assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[2], b[2], atol=1e-6)


def test_grouped_state_refuses_row_indexing():
    state = paper_like().init_state(torch.randn(2, 9, 8)).regroup(torch.tensor([0, 0, 1, 1]), None, 2)
    with pytest.raises(ValueError, match="regroup"):
        state.index(torch.tensor([0, 1]))


@pytest.mark.parametrize("changes", [{}, {"score": "dot"}, {"value_projection": True, "score": "general"},
                                     {"location": True, "score": "scaled_dot", "word_query": True, "positional": 4},
                                     {"score": "scaled_dot", "positional": 4, "lookalike": 2}],
                         ids=["additive", "dot", "value_projection", "shapes_recipe", "lookalike"])
def test_fast_teacher_forcing_gradients_reach_the_annotations_like_the_step_loop(changes):
    """A fine-tuned encoder: the annotations need a gradient, and the values' (and dot keys') gradients are summed
    over the steps at once (captioner.model.step_grad). They equal the per-step sums of the step loop."""
    from captioner.training.losses import caption_loss

    fast = paper_like(**changes).train()
    slow = copy.deepcopy(fast)
    annotations, captions, lengths = caption_batch()
    grads = []
    for model, forward in ((fast, lambda *a: fast(*a)), (slow, lambda *a: loop_forward(slow, *a))):
        leaf = annotations.clone().requires_grad_()
        out = forward(leaf, captions, lengths)
        loss, _ = caption_loss(out, captions[:, 1:], lambda_ds=1.0)
        loss.backward()
        grads.append([leaf.grad] + [p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert float(grads[0][0].abs().sum()) > 0


def test_step_reads_sum_the_gradient_of_every_read_once():
    """Reads of shrinking prefixes of rows, mixed weighted sums and dot products: autograd's own gradient."""
    from captioner.model.step_grad import StepReads

    g = torch.Generator().manual_seed(0)
    source = torch.randn(5, 7, 3, generator=g, requires_grad=True)
    weights = [torch.randn(b, 7, generator=g, requires_grad=True) for b in (5, 5, 3, 1)]
    queries = [torch.randn(b, 3, generator=g, requires_grad=True) for b in (5, 4, 2)]

    def loss(reads):
        total = sum((reads.weighted_sum(w) * (i + 1)).sum() for i, w in enumerate(weights))
        return total + sum((reads.dot(q) ** 2).sum() for q in queries)

    class Plain:  # the same reads with plain autograd
        def weighted_sum(self, w):
            return torch.bmm(w.unsqueeze(1), source[: w.shape[0]]).squeeze(1)

        def dot(self, q):
            return torch.bmm(source[: q.shape[0]], q.unsqueeze(-1)).squeeze(-1)

    leaves = [source, *weights, *queries]
    expected = torch.autograd.grad(loss(Plain()), leaves)
    got = torch.autograd.grad(loss(StepReads(source)), leaves)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, atol=1e-6)
