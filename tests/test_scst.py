"""Self-critical sequence training: CIDEr-D against pycocoevalcap, the object reward, the leave-one-out baseline,
sampling invariants, REINFORCE through hard attention's sampled locations, and a reward that goes up."""

import pytest
import torch

from captioner.model.decoder import Decoder
from captioner.scenes.training import CountReward, MixedReward, ObjectReward
from captioner.training.scst import CiderD, leave_one_out_advantage, rewards_for, sample_captions, scst_loss
from tests.test_model import VOCAB, tiny_cfg

REFS = [
    ["a red circle and a blue square", "a blue square beside a red circle", "there is a red circle"],
    ["two small red circles", "two little red discs", "a picture of two small red circles"],
    ["a big blue square above a small red circle", "a small red circle below a big blue square"],
]
CANDIDATES = ["a red circle and a blue square", "two red circles", "a small red circle", "blue blue blue"]
OWNERS = [0, 1, 2, 2]


def test_cider_matches_pycocoevalcap():
    from pycocoevalcap.cider.cider import Cider

    cider = CiderD([[r.split() for r in refs] for refs in REFS])
    ours = [cider.score(i, c.split()) for i, c in zip(OWNERS, CANDIDATES)]
    for i, c, mine in zip(OWNERS, CANDIDATES, ours):
        # pycocoevalcap takes its document frequencies from the references it is given: give it all three images
        gts = {k: REFS[k] for k in range(len(REFS))}
        res = {k: [c if k == i else REFS[k][0]] for k in range(len(REFS))}
        _, per_image = Cider().compute_score(gts, res)
        assert mine == pytest.approx(per_image[i], rel=1e-9, abs=1e-12)
    assert ours[0] > ours[3]  # a reference scores far above a stutter
    assert cider.score(1, []) == 0.0


def test_object_reward_hand_computed():
    red = {"size": "small", "color": "red", "shape": "circle"}
    blue = {"size": "large", "color": "blue", "shape": "square"}
    reward = ObjectReward([[red, red, blue]])
    assert reward.score(0, "two small red circles".split()) == pytest.approx(2 * 2 / (2 + 3))
    assert reward.score(0, "two small red circles and a big blue square".split()) == pytest.approx(1.0)
    assert reward.score(0, "a small red circle a small red circle and a big blue box".split()) == pytest.approx(1.0)
    assert reward.score(0, "a big red circle".split()) == 0.0
    assert list(rewards_for(reward, [0, 0], [["a", "big", "red", "circle"], "two small red circles".split()])) == \
        pytest.approx([0.0, 0.8])


def test_mixed_reward_adds_weighted_object_f1():
    red = {"size": "small", "color": "red", "shape": "circle"}
    refs = [[r.split() for r in refs] for refs in REFS] + [["two small red circles".split(),
                                                            "two little red circles".split()]]
    cider = CiderD(refs)  # the other images give the n-grams their document frequencies
    mixed = MixedReward(cider, ObjectReward([[]] * len(REFS) + [[red, red]]), weight=10.0)
    said_two, listed = "two small red circles".split(), "a small red circle a small red circle".split()
    assert mixed.score(3, said_two) == pytest.approx(cider.score(3, said_two) + 10.0)
    assert mixed.score(3, listed) == pytest.approx(cider.score(3, listed) + 10.0)  # the same objects, same F1
    assert mixed.score(3, said_two) > mixed.score(3, listed) + 1.0  # CIDEr-D prefers the references' "two"



def _counting_reward(scenes, refs):
    cider = CiderD([[r.split() for r in rs] for rs in REFS] + [[r.split() for r in rs] for rs in refs])
    scenes = [[]] * len(REFS) + scenes  # the other images give the n-grams their document frequencies
    return cider, MixedReward(cider, ObjectReward(scenes), 10.0, CountReward(scenes), count_weight=10.0)


def test_count_reward_prefers_the_right_number_word():
    red = {"size": "small", "color": "red", "shape": "circle"}
    pair, one = len(REFS), len(REFS) + 1
    cider, reward = _counting_reward([[red, red], [red]], [["two small red circles", "two little red discs"],
                                                           ["a small red circle", "a little red disc"]])
    said_two, listed, said_a = ("two small red circles".split(), "a small red circle and a small red circle".split(),
                                "a small red circle".split())
    assert reward.score(pair, said_two) == pytest.approx(cider.score(pair, said_two) + 10.0 + 10.0)
    assert reward.score(pair, listed) == pytest.approx(cider.score(pair, listed) + 10.0 + 0.0)  # same F1, no count
    assert reward.score(pair, said_two) > reward.score(pair, listed) + 10.0
    assert reward.score(pair, said_two) > reward.score(pair, said_a) + 10.0
    assert reward.score(one, said_a) > reward.score(one, said_two) + 10.0
    assert reward.counts.score(one, "a big blue box".split()) == 0.0  # names no group of the scene: 0 on counts


def test_count_reward_over_the_scene_charges_a_group_left_out():
    red, blue = ({"size": "small", "color": "red", "shape": "circle"},
                 {"size": "large", "color": "blue", "shape": "square"})
    scenes = [[red, red, blue]]
    named, scene = CountReward(scenes), CountReward(scenes, over="scene")
    only_sure = "two small red circles".split()  # the blue box left out
    both = "two small red circles and a large blue box".split()
    wrong_box = "two small red circles and two large blue boxes".split()
    assert named.score(0, only_sure) == 1.0 and scene.score(0, only_sure) == pytest.approx(0.5)
    assert named.score(0, both) == scene.score(0, both) == 1.0
    assert scene.score(0, wrong_box) == scene.score(0, only_sure)  # left out = counted wrong
    assert scene.score(0, "a big green star".split()) == 0.0
    with pytest.raises(ValueError, match="over"):
        CountReward(scenes, over="all")


def test_count_reward_can_charge_a_group_named_in_several_phrases():
    red, blue = ({"size": "small", "color": "red", "shape": "circle"},
                 {"size": "large", "color": "blue", "shape": "square"})
    scenes = [[red, red, blue]]
    split = "a small red circle a large blue box and a small red circle".split()
    too_few = "a small red circle and a large blue box".split()
    plain, charged = CountReward(scenes, over="scene"), CountReward(scenes, over="scene", split_score=-1.0)
    assert plain.score(0, split) == plain.score(0, too_few) == pytest.approx(0.5)  # both: the pair counted wrong
    assert charged.score(0, split) == pytest.approx(0.0) and charged.score(0, too_few) == pytest.approx(0.5)
    right = "two small red circles and a large blue box".split()
    assert charged.score(0, right) == plain.score(0, right) == 1.0


def test_make_reward_builds_the_counting_reward():
    from captioner.training.config import ScstConfig, SettingError, TrainConfig
    from captioner.training.inputs import make_reward

    red = {"size": "small", "color": "red", "shape": "circle"}

    class Split:  # what make_reward reads of a KarpathySplit
        records = [{"objects": [red, red]}, {"objects": [red]}]
        json_path = "scenes.json"
        plugin = "scenes"  # the JSON's "plugin": the scene terms come from the scenes' plug-in

        def __len__(self):
            return 2

        def references(self, i):
            return [["two", "small", "red", "circles"]] if i == 0 else [["a", "small", "red", "circle"]]

    reward = make_reward(ScstConfig(reward="cider+objects+counts"), Split(), {"count_weight": 3.0})
    assert isinstance(reward.counts, CountReward) and reward.count_weight == 3.0
    assert make_reward(ScstConfig(reward="cider+objects"), Split()).counts is None
    from captioner.errors import CaptionerError

    class Photos(Split):  # a JSON that names no plug-in: no scene terms to score against
        plugin = None

    with pytest.raises(CaptionerError, match="plug-in"):
        make_reward(ScstConfig(reward="cider+objects"), Photos())
    assert isinstance(make_reward(ScstConfig(reward="cider"), Photos()), CiderD)
    TrainConfig().updated({"scst": {"reward": "cider+objects+counts", "count_weight": 2.0}}).validate()
    with pytest.raises(SettingError, match="count-weight"):
        TrainConfig().updated({"scst": {"count_weight": -1.0}}).validate()
    # objects+counts: the two scene terms without CIDEr-D
    plain = make_reward(ScstConfig(reward="objects+counts"), Split(), {"object_weight": 10.0, "count_weight": 3.0})
    assert plain.cider is None and isinstance(plain.counts, CountReward)
    listed, said_two = "a small red circle and a small red circle".split(), "two small red circles".split()
    assert plain.score(0, said_two) == pytest.approx(10.0 + 3.0)
    assert plain.score(0, listed) == pytest.approx(10.0)  # the same objects, no group counted
    assert plain.score(1, said_two) == pytest.approx(10.0 * 2 / 3)  # one of the two named, precision 1/2
    TrainConfig().updated({"scst": {"reward": "objects+counts"}}).validate()
    assert make_reward(ScstConfig(reward="objects+counts"), Split(), {"count_over": "scene"}).counts.over == "scene"
    assert plain.counts.over == "named"  # the default: as count accuracy is measured
    with pytest.raises(SettingError, match="count-over"):
        TrainConfig().updated({"scst": {"count_over": "all"}}).validate()
    from captioner.commands.train import get_args_parser
    from captioner.training.flags import from_args
    cfg = from_args(get_args_parser().parse_args(["--scst-reward", "objects+counts", "--scst-count-over", "scene"]))
    assert cfg.plugin["count_over"] == "scene"


def test_leave_one_out_advantage():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])  # two images, three samples each
    adv = leave_one_out_advantage(rewards, 3)
    assert adv.tolist() == pytest.approx([1 - 2.5, 2 - 2.0, 3 - 1.5, 0.0, 0.0, 0.0])


def _decoder(seed: int = 0, **cfg) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(tiny_cfg(**cfg))


def test_sample_shapes_and_mask():
    decoder = _decoder().train()
    annotations = torch.randn(3, 9, 8)  # (B, L, C)
    s = sample_captions(decoder, annotations, 4, VOCAB.start_index, VOCAB.end_index, max_len=6)
    N, T = s.words.shape
    assert N == 12 and T <= 6 and s.log_probs.shape == s.mask.shape == (N, T)
    for words, mask in zip(s.words.tolist(), s.mask.tolist()):
        n = sum(mask)
        assert mask == [True] * n + [False] * (T - n)  # alive up to and including <end>
        assert all(w == 0 for w in words[n:])  # padding after the end
        assert VOCAB.end_index not in words[: n - 1] and VOCAB.start_index not in words and 0 not in words[:n]
        assert n == T or words[n - 1] == VOCAB.end_index
    assert torch.isfinite(s.log_probs[s.mask]).all() and (s.log_probs[s.mask] <= 0).all()
    assert s.entropy is None


@pytest.mark.parametrize("score", ["additive", "scaled_dot"], ids=["every_row", "drops_finished_rows"])
def test_reinforce_reaches_hard_attention_through_the_sampled_location(score):
    """With sampled contexts, the attention score is not on the path to the words' probabilities except through
    which annotation was picked: its gradient has to come from the log alpha of the sampled locations."""
    from captioner.training import scst

    decoder = _decoder(attention="hard", score=score).train()
    annotations = torch.randn(2, 9, 8)
    assert scst.drops_finished_rows(decoder, annotations) == (score == "scaled_dot")
    s = sample_captions(decoder, annotations, 3, VOCAB.start_index, VOCAB.end_index, max_len=5, use_sample=True)
    assert s.entropy is not None and s.entropy.shape == s.mask.shape
    advantage = torch.linspace(-1, 1, 6)
    scst_loss(s, advantage).backward()
    score_grads = [p.grad for p in decoder.attention.score.parameters() if p.requires_grad]
    assert score_grads and all(g is not None and g.abs().sum() > 0 for g in score_grads)
    # The expected context: the words' probabilities depend on alpha directly; no location term is added.
    decoder.zero_grad()
    e = sample_captions(decoder, annotations, 3, VOCAB.start_index, VOCAB.end_index, max_len=5, use_sample=False)
    scst_loss(e, advantage).backward()
    assert all(p.grad is not None for p in decoder.attention.score.parameters())


def test_entropy_bonus_sign():
    decoder = _decoder(attention="hard").train()
    s = sample_captions(decoder, torch.randn(2, 9, 8), 2, VOCAB.start_index, VOCAB.end_index, max_len=4,
                        use_sample=True)
    zero = torch.zeros(4)
    assert float(scst_loss(s, zero, entropy_weight=0.1).detach()) < 0.0  # a bonus: positive entropy lowers the loss


class _SaysRed:
    """Reward 1 for every caption that contains 'red'."""

    def score(self, image, tokens):
        return float("red" in tokens)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_scst_raises_the_reward(attention):
    decoder = _decoder(seed=1, attention=attention).train()
    annotations = torch.randn(4, 9, 8)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=2e-2)
    reward, n = _SaysRed(), 4

    def mean_reward(samples) -> float:
        words = [VOCAB.decode(row) for row in samples.words.tolist()]
        return float(rewards_for(reward, [0] * len(words), words).mean())

    torch.manual_seed(0)
    with torch.no_grad():
        before = mean_reward(sample_captions(decoder, annotations, 16, VOCAB.start_index, VOCAB.end_index, 6))
    for _ in range(30):
        s = sample_captions(decoder, annotations, n, VOCAB.start_index, VOCAB.end_index, 6, use_sample=True)
        words = [VOCAB.decode(row) for row in s.words.tolist()]
        r = torch.as_tensor(rewards_for(reward, [0] * len(words), words), dtype=torch.float32)
        optimizer.zero_grad()
        scst_loss(s, leave_one_out_advantage(r, n)).backward()
        optimizer.step()
    with torch.no_grad():
        after = mean_reward(sample_captions(decoder, annotations, 16, VOCAB.start_index, VOCAB.end_index, 6))
    assert after > before + 0.3, (before, after)


@pytest.mark.parametrize("changes", [{}, {"location": True, "score": "scaled_dot"}, {"attention": "hard"}],
                         ids=["soft", "location", "hard"])
def test_samples_share_their_image_keys_like_copied_annotations(changes):
    """sample_captions keeps one copy of each image's keys and values for its n samples (State.group). The draws,
    log-probabilities and their gradients equal those of a decoder fed n copies of every image."""
    from captioner.training.scst import sample_captions

    torch.manual_seed(0)
    decoder = Decoder(tiny_cfg(**changes)).train()
    if decoder.attention.score.location is not None:
        torch.nn.init.normal_(decoder.attention.score.location.weight)
    annotations = torch.randn(3, decoder.cfg.grid ** 2, decoder.cfg.encoder_channels)  # (B, L, C)

    def copied(annotations, n, *args, **kwargs):  # the reference: every image repeated n times, one row each
        return sample_captions(decoder, annotations.repeat_interleave(n, 0), 1, *args, **kwargs)

    results = []
    for draw in (lambda: sample_captions(decoder, annotations, 4, 1, 2, 8, True),
                 lambda: copied(annotations, 4, 1, 2, 8, True)):
        torch.manual_seed(7)
        samples = draw()
        decoder.zero_grad()
        (samples.log_probs * samples.mask).sum().backward()
        results.append((samples, [p.grad.clone() for p in decoder.parameters() if p.grad is not None]))
    (a, grads_a), (b, grads_b) = results
    assert torch.equal(a.words, b.words) and torch.equal(a.mask, b.mask)
    assert torch.allclose(a.log_probs, b.log_probs, atol=1e-5)
    assert len(grads_a) == len(grads_b)
    for x, y in zip(grads_a, grads_b):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4)


SHRINKING = [{"score": "scaled_dot"}, {"score": "dot", "location": True, "positional": 4},
             {"score": "general", "deep_output": False}, {"score": "scaled_dot", "count_head": True},
             {"score": "scaled_dot", "value_projection": True, "word_query": True},
             {"score": "scaled_dot", "location": True, "positional": 4, "lookalike": 2},
             {"attention": "hard", "score": "scaled_dot"},
             {"attention": "hard", "score": "scaled_dot", "location": True, "positional": 4, "lookalike": 2,
              "count_head": True, "word_query": True}]


@pytest.mark.parametrize("fine_tuned", [False, True], ids=["cached", "fine_tuned"])
@pytest.mark.parametrize("changes", SHRINKING, ids=["scaled_dot", "dot-location", "general", "count-head",
                                                    "value-projection", "lookalike", "hard", "hard-recipe"])
def test_sampling_that_drops_finished_rows_scores_what_teacher_forcing_scores(monkeypatch, changes, fine_tuned):
    """Where drops_finished_rows, the step runs on fewer rows as samples end, and on fewer images as all of an
    image's samples end. The log-probabilities it returns, and their gradients (the annotations' too, for a
    fine-tuned encoder), equal those of the plain step loop (eval mode, no dropout) teacher-forcing the same words.
    Hard attention is drawn with the expected context here (the eval-mode loop's); its sampled locations are read as
    the plain pick reads them (tests/test_decoder_speedpaths.py), and its entropy is that of the loop's alphas."""
    from captioner.training import scst

    images_read, real_rows = [], scst._reading_rows

    def reading_rows(*args):
        state = real_rows(*args)
        images_read.append(state.keys.shape[0])  # K images still read
        return state

    monkeypatch.setattr(scst, "_reading_rows", reading_rows)
    torch.manual_seed(3)
    decoder = Decoder(tiny_cfg(**changes)).train()
    if decoder.attention.score.location is not None:
        torch.nn.init.normal_(decoder.attention.score.location.weight)
    out = decoder.L_o if decoder.cfg.deep_output else decoder.fc
    with torch.no_grad():
        out.bias[VOCAB.end_index] += 2.5  # samples end at different steps
    leaf = torch.randn(4, decoder.cfg.grid ** 2, decoder.cfg.encoder_channels).requires_grad_(fine_tuned)
    annotations = leaf * 1.0  # (B, L, C)
    assert scst.drops_finished_rows(decoder, annotations)
    stepped, step = [], decoder.step

    def counting_step(words, state, use_sample=None):
        stepped.append(words.shape[0])
        return step(words, state, use_sample)

    decoder.step = counting_step
    torch.manual_seed(11)
    hard = decoder.attention.hard
    samples = sample_captions(decoder, annotations, 5, VOCAB.start_index, VOCAB.end_index, max_len=12,
                              use_sample=False if hard else None)
    assert (samples.entropy is not None) == hard
    del decoder.step
    assert stepped[0] == 20 and min(stepped) < 20 and stepped == sorted(stepped, reverse=True), stepped
    assert images_read[0] == 4 and min(images_read) < 4, images_read
    decoder.zero_grad()
    (samples.log_probs * samples.mask).sum().backward()
    grads = {k: p.grad.clone() for k, p in decoder.named_parameters() if p.grad is not None}
    leaf_grad = leaf.grad.clone() if fine_tuned else None
    if fine_tuned:
        leaf.grad = None

    lengths = samples.mask.sum(1) + 1  # <start> + the words up to <end>
    captions = torch.cat([torch.full((20, 1), VOCAB.start_index), samples.words], 1)  # (N, T + 1)
    decoder.eval().zero_grad()  # the step loop, with autograd; dropout is 0 in tiny_cfg
    reference_out = decoder((leaf * 1.0).repeat_interleave(5, 0), captions, lengths)
    logits = reference_out.logits  # (N, T, V)
    if hard:
        alphas = reference_out.alphas.detach()  # (N, T, L)
        entropy = -(alphas * alphas.clamp_min(1e-12).log()).sum(-1)  # (N, T)
        assert torch.allclose(samples.entropy.detach() * samples.mask, entropy * samples.mask, atol=1e-5)
    never = torch.zeros(len(VOCAB), dtype=torch.bool)
    never[[0, VOCAB.start_index]] = True
    logp = logits.masked_fill(never, float("-inf")).log_softmax(-1)
    taken = logp.gather(2, samples.words.clamp_min(1).unsqueeze(2)).squeeze(2).masked_fill(~samples.mask, 0.0)
    assert torch.allclose(taken, samples.log_probs.masked_fill(~samples.mask, 0.0), atol=1e-5)
    (taken * samples.mask).sum().backward()
    reference = {k: p.grad for k, p in decoder.named_parameters() if p.grad is not None}
    assert grads.keys() == reference.keys()
    for k in grads:
        assert torch.allclose(grads[k], reference[k], atol=1e-5, rtol=1e-4), k
    if fine_tuned:
        assert torch.allclose(leaf_grad, leaf.grad, atol=1e-5, rtol=1e-4)


def test_sampling_keeps_every_row_where_it_cannot_drop_them():
    from captioner.training import scst

    annotations = torch.randn(2, 9, 8)
    for changes in ({"attention": "hard", "score": "additive"}, {"score": "additive"}, {"channel_attention": True}):
        assert not scst.drops_finished_rows(_decoder(**changes).train(), annotations), changes
    assert scst.drops_finished_rows(_decoder(attention="hard", score="scaled_dot").train(), annotations)
    decoder = _decoder(score="scaled_dot").train()
    with torch.no_grad():
        assert not scst.drops_finished_rows(decoder, annotations)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not scst.drops_finished_rows(decoder, annotations)
    assert scst.drops_finished_rows(decoder, annotations)
