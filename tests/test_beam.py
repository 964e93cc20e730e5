"""Greedy decoding and batched beam search: agreement, scores, attention rows, limits."""

import copy

import pytest
import torch

from captioner.decoding.search import beam_search, beam_search_nbest, greedy_decode
from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from captioner.training.losses import caption_loss
from captioner.vocab import Vocabulary

VOCAB = Vocabulary(["a", "red", "blue", "circle", "square", "two", "small", "and"])
START, END = VOCAB.start_index, VOCAB.end_index
C, L = 8, 9


SENTENCES = ["a red circle", "two small blue squares", "a small red square and a blue circle", "red",
             "a blue square and two circles", "small small small"]


@pytest.fixture(scope="module", params=[{}, {"location": True, "word_query": True},
                                        {"location": True, "word_query": True, "score": "scaled_dot"}],
                ids=["plain", "location+word_query", "location+scaled_dot"])
def trained(request) -> Decoder:
    """A tiny decoder fitted for a few steps to six captions of 1-8 words: it ends its captions by itself.
    Every test runs three times: plain attention; location-aware attention (whose state carries alpha history)
    with the word-aware query (which reads the step's input word); and the same with a dot-product score, whose
    location term is a matrix product (kept between decoding steps) instead of a convolution."""
    torch.manual_seed(0)
    cfg = ModelConfig(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=C, hidden_dim=32,
                      embed_dim=16, attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), **request.param)
    decoder = Decoder(cfg)
    ids = [VOCAB.encode(s.split()) for s in SENTENCES]
    captions = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)  # (B, T+1)
    for row, x in enumerate(ids):
        captions[row, : len(x)] = torch.tensor(x)
    lengths = torch.tensor([len(x) for x in ids])
    optimizer = torch.optim.Adam(decoder.parameters(), lr=3e-2)
    for _ in range(15):
        loss, _ = caption_loss(decoder(annotations(len(ids)), captions, lengths), captions[:, 1:], 1.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return decoder.eval()


def make_decoder(trained: Decoder, end_bias: float = 0.0) -> Decoder:
    """A copy of ``trained``; a large negative ``end_bias`` on the <end> logit makes every caption run to max_len."""
    decoder = copy.deepcopy(trained)
    with torch.no_grad():
        decoder.L_o.bias[END] += end_bias
    return decoder


def annotations(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, L, C, generator=torch.Generator().manual_seed(seed))  # (B, L, C)


def teacher_forced_log_prob(decoder: Decoder, annots: torch.Tensor, words: list[int], ended: bool):
    """Sum of log p(word) over the words (+ <end> when ended) and the alphas, by the training-time forward pass."""
    ids = [START, *words] + ([END] if ended else [])
    captions = torch.tensor([ids])
    with torch.no_grad():
        out = decoder(annots, captions, torch.tensor([len(ids)]))
    logp = out.logits[0].double().log_softmax(-1)  # (T, V)
    targets = torch.tensor(ids[1:])
    return float(logp.gather(1, targets[:, None]).sum()), out.alphas[0]


def inputs() -> torch.Tensor:
    """Three training images and three unseen ones: sure and unsure captions."""
    return torch.cat([annotations(6)[:3], annotations(3, seed=5)])  # (6, L, C)


def test_beam_one_equals_greedy(trained):
    decoder, annots = make_decoder(trained), inputs()
    greedy = greedy_decode(decoder, annots, START, END, max_len=12)
    beam = beam_search(decoder, annots, START, END, beam_size=1, max_len=12)
    for g, b in zip(greedy, beam):
        assert g.words == b.words and g.ended == b.ended
        assert torch.allclose(g.alphas, b.alphas, atol=1e-6)
        assert g.log_prob == pytest.approx(b.log_prob, abs=1e-6)
    assert all(g.ended for g in greedy) and len({len(g.words) for g in greedy}) > 2


def test_nbest_scores_do_not_increase_with_rank(trained):
    decoder, annots = make_decoder(trained), inputs()
    for nbest in beam_search_nbest(decoder, annots, START, END, beam_size=4, max_len=10):
        assert len(nbest) == 4
        scores = [h.log_prob for h in nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.words) for h in nbest}) == len(nbest)  # distinct hypotheses


@pytest.mark.parametrize("max_len", [1, 2, 3])
def test_nbest_holds_at_most_beam_size(trained, max_len):
    """Finished captions and beams cut at max_len together are still at most beam_size, best first."""
    decoder, annots = make_decoder(trained), inputs()
    for nbest in beam_search_nbest(decoder, annots, START, END, beam_size=3, max_len=max_len):
        assert 1 <= len(nbest) <= 3
        scores = [h.log_prob for h in nbest]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("end_bias", [0.0, -100.0])  # captions that end, and captions cut at max_len
@pytest.mark.parametrize("beam_size", [1, 3])
def test_log_prob_and_alphas_match_teacher_forcing(trained, end_bias, beam_size):
    decoder, annots = make_decoder(trained, end_bias), inputs()
    max_len = 9
    if beam_size == 1:
        hyps = [[h] for h in greedy_decode(decoder, annots, START, END, max_len=max_len)]
    else:
        hyps = beam_search_nbest(decoder, annots, START, END, beam_size=beam_size, max_len=max_len)
    for b, nbest in enumerate(hyps):
        for h in nbest:
            assert len(h.words) <= max_len
            if end_bias < 0:  # <end> is all but impossible: every caption is cut at max_len
                assert not h.ended and len(h.words) == max_len
            assert h.alphas.shape == (len(h.words), L)
            assert torch.allclose(h.alphas.sum(-1), torch.ones(len(h.words)), atol=1e-5)
            log_prob, alphas = teacher_forced_log_prob(decoder, annots[b:b + 1], h.words, h.ended)
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
            assert torch.allclose(h.alphas, alphas[: len(h.words)], atol=1e-5)


def test_batched_beam_equals_one_at_a_time(trained):
    decoder, annots = make_decoder(trained), inputs()
    batched = beam_search_nbest(decoder, annots, START, END, beam_size=3, max_len=10)
    for b in range(len(annots)):
        alone = beam_search_nbest(decoder, annots[b:b + 1], START, END, beam_size=3, max_len=10)[0]
        assert [h.words for h in alone] == [h.words for h in batched[b]]
        assert [h.log_prob for h in alone] == pytest.approx([h.log_prob for h in batched[b]], abs=1e-5)
        assert [h.ended for h in alone] == [h.ended for h in batched[b]]


def test_max_len_respected(trained):
    annots = inputs()
    for decoder in (make_decoder(trained), make_decoder(trained, end_bias=-100.0)):
        for max_len in (1, 4):
            for h in beam_search(decoder, annots, START, END, beam_size=3, max_len=max_len):
                assert len(h.words) <= max_len
            for h in greedy_decode(decoder, annots, START, END, max_len=max_len):
                assert len(h.words) <= max_len
    for h in greedy_decode(decoder, annots, START, END, max_len=4):  # the never-ending decoder
        assert len(h.words) == 4 and not h.ended


def test_pad_and_start_never_emitted(trained):
    decoder, annots = make_decoder(trained), inputs()
    with torch.no_grad():
        decoder.L_o.bias[VOCAB.pad_index] += 50.0  # the model "wants" them most
        decoder.L_o.bias[START] += 50.0
    hyps = greedy_decode(decoder, annots, START, END, max_len=6)
    hyps += [h for nbest in beam_search_nbest(decoder, annots, START, END, beam_size=3, max_len=6) for h in nbest]
    for h in hyps:
        assert VOCAB.pad_index not in h.words and START not in h.words and END not in h.words
        assert h.log_prob > -1e9  # finite: never scored with a forbidden word


def _counting_steps(decoder: Decoder) -> list[int]:
    """Rows of every ``decoder.step`` call from now on (an instance attribute shadows the method)."""
    rows: list[int] = []
    step = decoder.step

    def counted(words, state, *args, **kwargs):
        rows.append(words.shape[0])
        return step(words, state, *args, **kwargs)

    decoder.step = counted
    return rows


@pytest.mark.parametrize("beam_size", [2, 3, 5])
def test_best_hypothesis_is_the_same_when_the_search_stops_at_it(trained, beam_size):
    """beam_search stops an image once its best finished caption beats every live beam (n_best=1) instead of
    waiting for beam_size finished ones: the same best caption, for less stepping."""
    annots = torch.cat([inputs(), annotations(10, seed=7)])  # (16, L, C): sure and unsure images
    full_decoder, early_decoder = make_decoder(trained), make_decoder(trained)
    full_rows, early_rows = _counting_steps(full_decoder), _counting_steps(early_decoder)
    full = beam_search_nbest(full_decoder, annots, START, END, beam_size=beam_size, max_len=12)
    early = beam_search(early_decoder, annots, START, END, beam_size=beam_size, max_len=12)
    for nbest, best in zip(full, early):
        assert best.words == nbest[0].words and best.ended == nbest[0].ended
        assert best.log_prob == pytest.approx(nbest[0].log_prob, abs=1e-5)
        assert torch.allclose(best.alphas, nbest[0].alphas, atol=1e-5)
    assert sum(early_rows) < sum(full_rows)  # it does stop earlier


def test_n_best_keeps_the_first_n(trained):
    decoder, annots = make_decoder(trained), torch.cat([inputs(), annotations(10, seed=7)])
    rows = _counting_steps(decoder)
    full = beam_search_nbest(decoder, annots, START, END, beam_size=4, max_len=10)
    full_rows = sum(rows)
    two = beam_search_nbest(decoder, annots, START, END, beam_size=4, max_len=10, n_best=2)
    for a, b in zip(full, two):
        assert [h.words for h in b[:2]] == [h.words for h in a[:2]]
    assert sum(rows) - full_rows < full_rows  # the n_best=2 search stepped fewer rows
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match="n_best"):
            beam_search_nbest(decoder, annots, START, END, beam_size=4, max_len=10, n_best=bad)


@pytest.mark.parametrize("length_penalty", [0.5, 1.0])
def test_with_a_length_penalty_the_best_is_that_of_the_full_search(trained, length_penalty):
    """A length penalty lets a longer hypothesis overtake a finished one: no early stop then, the same best."""
    annots = torch.cat([inputs(), annotations(10, seed=7)])
    full_decoder, best_decoder = make_decoder(trained), make_decoder(trained)
    full_rows, best_rows = _counting_steps(full_decoder), _counting_steps(best_decoder)
    full = beam_search_nbest(full_decoder, annots, START, END, beam_size=3, max_len=12, length_penalty=length_penalty)
    best = beam_search(best_decoder, annots, START, END, beam_size=3, max_len=12, length_penalty=length_penalty)
    assert [h.words for h in best] == [nbest[0].words for nbest in full]
    assert best_rows == full_rows  # the same search, step for step


def test_bad_beam_sizes_are_refused(trained):
    decoder, annots = make_decoder(trained), inputs()
    for bad in (0, 2.0, True, "3"):
        with pytest.raises(ValueError, match="beam_size"):
            beam_search(decoder, annots, START, END, beam_size=bad)
    import numpy as np

    assert [h.words for h in beam_search(decoder, annots, START, END, beam_size=np.int64(3))] == \
        [h.words for h in beam_search(decoder, annots, START, END, beam_size=3)]  # numpy integers are whole numbers


@torch.inference_mode()
def stepped_measures(decoder: Decoder, annots: torch.Tensor, words: list[int]) -> torch.Tensor:
    """(T, 3): p(word), beta and attention entropy per word, stepping the decoder through ``words`` one by one."""
    state, prev, rows = decoder.init_state(annots), torch.tensor([START]), []
    for word in words:
        beta = float(torch.sigmoid(decoder.f_beta(state.h))[0, 0])
        logits, state, alpha, _ = decoder.step(prev, state)
        a = alpha[0].double().clamp_min(1e-12)
        rows.append([float(logits[0].double().softmax(-1)[word]), beta, float(-(a * a.log()).sum())])
        prev = torch.tensor([word])
    return torch.tensor(rows, dtype=torch.float64).reshape(len(words), 3)


@pytest.mark.parametrize("end_bias", [0.0, -100.0])
def test_measured_beams_record_what_teacher_forcing_gives_and_change_nothing(trained, end_bias):
    decoder, annots = make_decoder(trained, end_bias), inputs()
    plain = beam_search_nbest(decoder, annots, START, END, beam_size=3, max_len=9)
    measured = beam_search_nbest(decoder, annots, START, END, beam_size=3, max_len=9, measure=True)
    for b, (hyps, recorded) in enumerate(zip(plain, measured)):
        assert [(h.words, h.log_prob, h.ended) for h in hyps] == [(h.words, h.log_prob, h.ended) for h in recorded]
        for h in recorded:
            assert h.measures.shape == (len(h.words), 3)
            assert torch.allclose(h.measures, stepped_measures(decoder, annots[b:b + 1], h.words), atol=1e-5)
    assert all(h.measures is None for hyps in plain for h in hyps)
