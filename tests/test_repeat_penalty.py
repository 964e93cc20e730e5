"""Decoding settings beside the weights: the repeat penalty (captioner.scenes.repeat_penalty), the length penalty from the
config, and the ``adjust`` hook of greedy and beam search that applies them."""

import json
import math

import pytest
import torch

from captioner.decoding.search import beam_search, beam_search_nbest, greedy_decode
from captioner.model.config import ModelConfig
from captioner.decoding.config import DecodingConfig
from captioner.errors import ConfigError
from tests.flat_configs import configs
from captioner.scenes.metrics import parse_objects
from captioner.model.captioner import Captioner
from captioner.scenes.phrase_order import PLACEHOLDER
from captioner.scenes.plugin import decoding_settings
from captioner.scenes.repeat_penalty import RepeatPenalty
from captioner.vocab import Vocabulary
from tests.test_beam import END, START, annotations, trained  # noqa: F401 (a fixture)

WORDS = [PLACEHOLDER, "a", "two", "big", "large", "small", "red", "blue", "circle", "disc", "circles", "square",
         "and", "of"]
VOCAB = Vocabulary(WORDS)
W = VOCAB.stoi


def ids(text: str) -> list[int]:
    return [W[w] for w in text.split()]


def test_a_noun_that_would_repeat_a_named_object_loses_the_weight():
    rule = RepeatPenalty(VOCAB.itos, 2.5)
    rows = ["<num> big red circle a and <num> large red",  # "large" is "big": circle, disc, circles repeat
            "<num> big red circle a and <num> small red",  # another size: nothing repeats
            "<num> big red circle a and <num> big blue",  # another colour
            "<num> big red circle a and <num> big",  # no colour yet: no noun is next
            "<num> big red square a and <num> big red"]  # only the square repeats
    history = torch.tensor([ids(r) for r in [rows[0], rows[1], rows[2]]])
    logp = torch.zeros(3, len(VOCAB), dtype=torch.float64)
    out = rule(history, logp.clone())
    lowered = {(r, VOCAB.itos[v]) for r, v in (out < 0).nonzero().tolist()}
    assert lowered == {(0, "circle"), (0, "disc"), (0, "circles")}
    assert out[0, W["circle"]] == -2.5 and out[0, W["square"]] == 0
    short = rule(torch.tensor([ids(rows[3])]), torch.zeros(1, len(VOCAB), dtype=torch.float64))
    assert not short.any()
    square = rule(torch.tensor([ids(rows[4])]), torch.zeros(1, len(VOCAB), dtype=torch.float64))
    assert {VOCAB.itos[v] for v in (square[0] < 0).nonzero().squeeze(1).tolist()} == {"square"}


def test_a_ban_gives_minus_infinity_and_no_nan_and_other_vocabularies_are_left_alone():
    rule = RepeatPenalty(VOCAB.itos, math.inf)
    out = rule(torch.tensor([ids("<num> big red circle a and <num> big red")]),
               torch.zeros(1, len(VOCAB), dtype=torch.float64))
    assert out[0, W["circle"]] == -math.inf and not out.isnan().any()
    photos = RepeatPenalty(Vocabulary(["a", "dog", "on", "the", "grass"]).itos, 5.0)
    assert not photos.active
    assert not RepeatPenalty(VOCAB.itos, 0.0).active


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_adjust_sees_each_rows_words_so_far_and_counts_in_the_log_prob(trained, search):  # noqa: F811
    """A function that lowers every word by c leaves the words alone and takes c per word (and <end>) from the
    log-probability; the history it sees is each hypothesis' own words so far."""
    ann = annotations(4)
    seen: list[torch.Tensor] = []

    def lower(history, logp):
        seen.append(history.clone())
        return logp - 0.25

    if search == "greedy":
        plain = greedy_decode(trained, ann, START, END, max_len=10)
        adjusted = greedy_decode(trained, ann, START, END, max_len=10, adjust=lower)
    else:
        plain = beam_search(trained, ann, START, END, beam_size=3, max_len=10)
        adjusted = beam_search(trained, ann, START, END, beam_size=3, max_len=10, adjust=lower)
    for p, a in zip(plain, adjusted):
        assert p.words == a.words
        steps = len(p.words) + int(p.ended)
        assert a.log_prob == pytest.approx(p.log_prob - 0.25 * steps)
    assert [h.shape[1] for h in seen] == list(range(len(seen)))  # step t sees t words
    finals = {tuple(row) for row in seen[-1].tolist()}
    assert all(tuple(h.words[: seen[-1].shape[1]]) in finals or len(h.words) < seen[-1].shape[1] for h in adjusted)


def test_a_banned_word_never_comes_out_of_beam_search(trained):  # noqa: F811
    ann = annotations(6)
    plain = beam_search_nbest(trained, ann, START, END, beam_size=3, max_len=10)
    common = max(range(len(trained.L_o.bias)), key=lambda v: sum(v in h.words for hs in plain for h in hs))

    def ban(history, logp):
        logp[:, common] = float("-inf")
        return logp

    banned = beam_search_nbest(trained, ann, START, END, beam_size=3, max_len=10, adjust=ban)
    assert any(common in h.words for hs in plain for h in hs)
    assert not any(common in h.words for hs in banned for h in hs)


MODEL = dict(encoder="small_cnn", encoder_weights=None, grid=3, encoder_channels=8, hidden_dim=32, embed_dim=16,
             attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), number_last=True)


def model_configs(**overrides) -> tuple[ModelConfig, DecodingConfig]:
    """The test model's config and its decoding settings, given in the flat form."""
    return configs(**{**MODEL, **overrides})


def model_cfg(**overrides) -> ModelConfig:
    return model_configs(**overrides)[0]


def test_the_config_holds_the_decoding_settings_and_checks_them():
    cfg = model_cfg()
    older = DecodingConfig.from_dict({"beam_size": 3}).validate(cfg.plugin_module(), cfg.plugin_config)
    assert older.length_penalty == 0.0 and decoding_settings(older.plugin_settings).repeat_penalty == 0.0
    for name, bad in [("length_penalty", -0.5), ("length_penalty", 11.0), ("repeat_penalty", -1.0),
                      ("repeat_penalty", float("nan")), ("repeat_penalty", "2")]:
        model, decoding = model_configs(**{name: bad})
        with pytest.raises(ConfigError, match=name):
            DecodingConfig.from_dict(decoding.to_dict()).validate(model.plugin_module(), model.plugin_config)
    torch.manual_seed(0)
    model = Captioner(model_cfg(), VOCAB).eval()
    assert model.score_processors == []
    model.set_decoding(repeat_penalty=3.0, length_penalty=1.5)
    assert model.decoding.plugin_settings["repeat_penalty"] == 3.0 and model.decoding.length_penalty == 1.5
    assert model.decoder.cfg is model.cfg
    (rule,) = model.score_processors
    assert isinstance(rule, RepeatPenalty) and rule.weight == 3.0
    with pytest.raises(ConfigError, match="length_penalty"):
        model.set_decoding(length_penalty=-1.0)
    assert model.decoding.length_penalty == 1.5  # a refused value changes nothing
    assert model.score_processors == [rule]
    with pytest.raises(ConfigError, match="beam"):
        model.set_decoding(beam=3)


def test_a_model_decodes_with_its_configs_penalties(monkeypatch):
    """Captioner.decode passes the config's length penalty and repeat rule to beam search (and the rule to greedy);
    an explicit length_penalty argument wins."""
    import captioner.model.captioner as model_module

    calls = []
    real_beam, real_greedy = model_module.beam_search, model_module.greedy_decode
    monkeypatch.setattr(model_module, "beam_search",
                        lambda *a: calls.append(("beam", a[6], a[7])) or real_beam(*a))
    monkeypatch.setattr(model_module, "greedy_decode",
                        lambda *a: calls.append(("greedy", None, a[5])) or real_greedy(*a))
    torch.manual_seed(0)
    cfg, decoding = model_configs(length_penalty=0.5, repeat_penalty=2.0)
    model = Captioner(cfg, VOCAB, decoding=decoding).eval()
    ann = torch.randn(2, 9, model.cfg.encoder_channels)  # (B, L, C)
    model.decode(ann, beam_size=3, max_len=6)
    model.decode(ann, beam_size=3, max_len=6, length_penalty=0.0)
    model.decode(ann, beam_size=1, max_len=6)
    (rule,) = model.score_processors
    assert calls == [("beam", 0.5, rule), ("beam", 0.0, rule), ("greedy", None, rule)]


def repeating_model(ann: torch.Tensor | None = None) -> tuple[Captioner, torch.Tensor]:
    """A tiny number_last model whose decoder is fitted to say "a big red circle and a big red circle" for the
    annotations ``ann`` (B, L, C) (default: random ones); returns (model, annotations)."""
    from captioner.training.losses import caption_loss

    torch.manual_seed(0)
    model = Captioner(model_cfg(), VOCAB).eval()
    if ann is None:
        ann = torch.randn(4, 9, model.cfg.encoder_channels)  # (B, L, C)
    words = ids("<num> big red circle a and <num> big red circle a")
    captions = torch.tensor([[VOCAB.start_index, *words, VOCAB.end_index]] * len(ann))  # (B, T+1)
    lengths = torch.full((len(ann),), captions.shape[1])
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=3e-2)
    model.decoder.train()
    for _ in range(60):
        loss, _ = caption_loss(model.decoder(ann, captions, lengths), captions[:, 1:], 1.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), ann


def keys(tokens) -> list:
    return [k for k, _, _ in parse_objects(tokens)]


def test_with_a_large_penalty_no_caption_names_an_object_twice(tmp_path):
    """A decoder trained to repeat itself ("a big red circle and a big red circle") names the circle once when the
    repeat penalty is large, and twice without it."""
    model, ann = repeating_model()

    before = [keys(model.to_result(h).tokens) for h in model.decode(ann[:1], beam_size=3, max_len=12)]
    model.set_decoding(repeat_penalty=1000.0)
    after = [keys(model.to_result(h).tokens) for h in model.decode(ann[:1], beam_size=3, max_len=12)]
    assert before == [[("large", "red", "circle")] * 2]
    assert after[0] and len(set(after[0])) == len(after[0])  # every object named once
    path = tmp_path / "ckpt"
    from captioner.checkpoints.folder import save_checkpoint
    from captioner.checkpoints.loading import load

    save_checkpoint(model, path)
    assert json.loads((path / "decoding.json").read_text())["plugin_settings"]["repeat_penalty"] == 1000.0
    assert load(path).decoding.plugin_settings["repeat_penalty"] == 1000.0


def test_tuning_picks_object_f1_plus_count_among_settings_that_keep_the_style():
    from scripts.tune_decoding import parse_values, pick

    def m(f1, count, cider):
        return {"object_f1": f1, "count_accuracy": count, "CIDEr-D": cider}

    current = (5.0, 0.0, 0.0)
    scores = {current: m(0.970, 0.950, 4.60), (5.0, 1.0, 2.0): m(0.975, 0.960, 4.58),
              (5.0, 2.0, 2.0): m(0.980, 0.961, 4.50),  # the best F1 + count, but its CIDEr-D fell by 0.10
              (10.0, 1.0, 2.0): m(0.975, 0.960, 4.59)}  # a tie with (5, 1, 2): the smaller settings win
    assert pick(scores, current) == (5.0, 1.0, 2.0)
    assert pick(scores, current, cider_drop=0.2) == (5.0, 2.0, 2.0)
    assert pick({current: m(0.9, 0.9, 4.0), (0.0, 0.0, 2.0): m(0.99, 0.99, 1.0)}, current) == current
    # the checkpoint's own settings are held to the same floor: a style they lost is not kept
    assert pick({current: m(0.98, 0.97, 3.2), (5.0, 0.0, 2.0): m(0.97, 0.96, 4.6)}, current) == (5.0, 0.0, 2.0)
    assert parse_values(None, "--inhibit", 5.0) == [5.0] and parse_values("2, 0,2", "--x", 1.0) == [0.0, 2.0]
    with pytest.raises(ValueError, match="--length-penalties"):
        parse_values("1,x", "--length-penalties", 0.0)


def test_the_app_decodes_with_the_checkpoints_settings():
    """The app's explanation (captioner.serving.explain, its own n-best beam search) writes the caption that
    model.caption writes, with the config's repeat and length penalties."""
    from PIL import Image

    from captioner.serving.explain import explain

    picture = Image.new("RGB", (64, 64), (200, 40, 40))
    torch.manual_seed(0)
    probe = Captioner(model_cfg(), VOCAB).eval()
    with torch.no_grad():
        ann = probe.encode(probe.transform(picture).unsqueeze(0))  # (1, L, C): the picture's own annotations
    model, _ = repeating_model(ann)
    model.encoder.load_state_dict(probe.encoder.state_dict())
    assert keys(explain(model, picture, 3)[0].tokens) == [("large", "red", "circle")] * 2
    model.set_decoding(repeat_penalty=1000.0, length_penalty=0.5)
    shown = explain(model, picture, 3)[0]
    assert shown.tokens == model.caption(picture, beam_size=3).tokens
    assert len(set(keys(shown.tokens))) == len(keys(shown.tokens)) > 0
