"""Inhibition of return (the scenes plug-in's decoding setting inhibit_named): at inference a number_last caption's attention moves away from
the locations that earlier phrases' number words looked at, so one object is not named twice."""

import pytest
import torch

from captioner.decoding.search import beam_search, greedy_decode
from captioner.model.config import ModelConfig
from captioner.model.decoder import Decoder
from captioner.decoding.config import DecodingConfig
from captioner.errors import ConfigError
from captioner.checkpoints.version1 import split
from tests.flat_configs import configs
from captioner.model.captioner import Captioner
from captioner.scenes.extension import Named
from captioner.scenes.plugin import SceneDecoding, decoding_settings
from captioner.scenes.phrase_order import PLACEHOLDER
from captioner.vocab import Vocabulary

VOCAB = Vocabulary([PLACEHOLDER, "a", "two", "red", "blue", "circle", "and", "picture", "of"])
W = VOCAB.stoi


GRID = 5


BASE = dict(encoder="small_cnn", encoder_weights=None, grid=GRID, encoder_channels=8, hidden_dim=32, embed_dim=16,
            attention_dim=16, dropout=0.0, vocab_size=len(VOCAB), number_last=True, location=True,
            word_query=True, score="scaled_dot")


def configs_of(**overrides) -> tuple[ModelConfig, DecodingConfig]:
    return configs(**{**BASE, **overrides})


def cfg(**overrides) -> ModelConfig:
    return configs_of(**overrides)[0]


def validate(**overrides) -> None:
    """The model's and the decoding settings' checks, as a checkpoint's are run."""
    model, decoding = configs_of(**overrides)
    model.validate()
    decoding.validate(model.plugin_module(), model.plugin_config)


def decoder(weight: float, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    dec = Decoder.build(cfg()).eval()
    dec.extension.set_inhibition([W["a"], W["two"]], W[PLACEHOLDER], weight)
    return dec


def test_a_number_word_closes_an_open_phrase_and_marks_what_it_looked_at():
    closers = torch.zeros(len(VOCAB), dtype=torch.bool)
    closers[[W["a"], W["two"]]] = True
    look = torch.tensor([[0.0, 0.8, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])  # a 3x3 grid
    state = Named(torch.zeros(1, 9), look, torch.zeros(1, dtype=torch.bool))
    # "a" outside a phrase ("a picture of") names nothing
    assert state.after(torch.tensor([W["a"]]), closers, W[PLACEHOLDER]).named.sum() == 0
    opened = state.after(torch.tensor([W[PLACEHOLDER]]), closers, W[PLACEHOLDER])
    assert bool(opened.open[0])
    inside = opened.after(torch.tensor([W["red"]]), closers, W[PLACEHOLDER])
    assert bool(inside.open[0]) and inside.named.sum() == 0
    closed = inside.after(torch.tensor([W["two"]]), closers, W[PLACEHOLDER])
    assert not bool(closed.open[0])
    assert torch.equal(closed.named, look)  # the attention that chose the number word
    named = torch.tensor([[2.0, 0, 0, 0, 0, 0, 0, 0, 0.4]])
    # capped at one look, and spread to the 8 neighbours: cell 0 reaches 1, 3, 4; cell 8 reaches 4, 5, 7
    assert Named(named, look, closed.open).bias(10.0)[0].tolist() == pytest.approx(
        [-10.0, -10.0, 0.0, -10.0, -10.0, -4.0, 0.0, -4.0, -4.0])


def _steps(dec: Decoder, annotations: torch.Tensor, words: list[str]) -> list[torch.Tensor]:
    """Teacher-fed inference steps: the alpha of each step after feeding ``words`` one by one."""
    state = dec.init_state(annotations)
    alphas = []
    with torch.inference_mode():
        for w in ["<start>", *words]:
            _, state, alpha, _ = dec.step(torch.tensor([VOCAB.stoi[w]]), state)
            alphas.append(alpha[0])
    return alphas


def test_attention_leaves_what_a_closed_phrase_looked_at():
    annotations = torch.randn(1, GRID * GRID, 8, generator=torch.Generator().manual_seed(1))
    words = ["picture", "of", PLACEHOLDER, "red", "circle", "a", "and", PLACEHOLDER, "red"]
    plain, inhibited = _steps(decoder(0.0), annotations, words), _steps(decoder(50.0), annotations, words)
    close = words.index("a")  # alphas[i] is the step after words[i - 1]: alphas[close] chose "a"
    for i in range(close + 1):  # the same until the phrase is closed
        assert torch.allclose(plain[i], inhibited[i], atol=1e-6)
    for i in range(close + 1, len(plain)):  # then attention moves off what "a" looked at
        assert not torch.allclose(plain[i], inhibited[i], atol=1e-4)
        assert (inhibited[i] * plain[close]).sum() < (plain[i] * plain[close]).sum()


def test_a_fully_named_location_gets_no_attention():
    dec, plain = decoder(50.0), decoder(0.0)
    annotations = torch.randn(2, GRID * GRID, 8, generator=torch.Generator().manual_seed(4)) * 5  # peaked attention
    words = torch.tensor([W["and"], W["and"]])
    with torch.inference_mode():
        base = plain.step(words, plain.init_state(annotations))[2]  # (2, L)
        peak = base.argmax(-1)  # (2,)
        state = dec.init_state(annotations)
        state.extra = Named(torch.nn.functional.one_hot(peak, GRID * GRID).float(), torch.zeros(2, GRID * GRID),
                            state.extra.open)
        alpha = dec.step(words, state)[2]
    rows = torch.arange(2)
    assert (base[rows, peak] > 0.1).all()  # where the plain model looks most (uniform: 0.04) ...
    assert (alpha[rows, peak] < 1e-6).all()  # ... an inhibited one does not look at all
    assert torch.allclose(alpha.sum(-1), torch.ones(2))


def test_training_and_teacher_forcing_ignore_it():
    torch.manual_seed(0)
    annotations = torch.randn(2, GRID * GRID, 8)
    captions = torch.tensor([[1, W[PLACEHOLDER], W["red"], W["circle"], W["a"], W["and"], W[PLACEHOLDER], W["red"],
                              2]] * 2)
    lengths = torch.tensor([9, 9])
    on, off = decoder(50.0).train(), decoder(0.0).train()
    assert on.init_state(annotations).extra is None  # training (SCST's samples too) never inhibits
    assert torch.allclose(on(annotations, captions, lengths).logits, off(annotations, captions, lengths).logits)


def test_batched_beam_search_equals_one_image_at_a_time():
    dec = decoder(20.0, seed=3)
    ann = torch.randn(4, GRID * GRID, 8, generator=torch.Generator().manual_seed(2))
    batched = beam_search(dec, ann, VOCAB.start_index, VOCAB.end_index, beam_size=3, max_len=12)
    for i in range(4):
        single = beam_search(dec, ann[i:i + 1], VOCAB.start_index, VOCAB.end_index, beam_size=3, max_len=12)[0]
        assert single.words == batched[i].words
        assert single.log_prob == pytest.approx(batched[i].log_prob, abs=1e-5)
    greedy = greedy_decode(dec, ann, VOCAB.start_index, VOCAB.end_index, max_len=12)
    one = beam_search(dec, ann, VOCAB.start_index, VOCAB.end_index, beam_size=1, max_len=12)
    assert [h.words for h in greedy] == [h.words for h in one]


def test_config_checks_and_old_configs():
    with pytest.raises(ConfigError, match="inhibit_named.*number_last"):
        validate(number_last=False, inhibit_named=5.0)
    for bad in (-1.0, float("nan"), "5", True, 1e6):
        with pytest.raises(ConfigError, match="inhibit_named"):
            validate(inhibit_named=bad)
    assert SceneDecoding().inhibit_named == 0.0
    # a flat (version-1) config saved before the setting existed: it is off
    old = {**ModelConfig().to_dict(), "number_last": True, "max_len": 30, "length_penalty": 0.0}
    for name in ("plugin", "plugin_config"):
        del old[name]
    model, decoding = split(old)
    model = ModelConfig.from_dict(model)
    decoding = DecodingConfig.from_dict(decoding).validate(model.plugin_module(), model.plugin_config)
    assert model.plugin_config == {"number_last": True}
    assert decoding_settings(decoding.plugin_settings).inhibit_named == 0.0


def test_the_captioner_wires_its_vocabulary_and_can_change_the_weight():
    model = Captioner(cfg(), VOCAB).eval()
    extension = model.decoder.extension
    assert extension.opener == W[PLACEHOLDER]
    assert extension.closers[[W["a"], W["two"]]].all() and int(extension.closers.sum()) == 2
    assert model.decoder.init_state(torch.zeros(1, GRID * GRID, model.cfg.annotation_channels)).extra is None
    model.set_decoding(inhibit_named=30.0)
    assert model.decoding.plugin_settings["inhibit_named"] == extension.inhibit_named == 30.0
    assert model.decoder.init_state(torch.zeros(1, GRID * GRID, model.cfg.annotation_channels)).extra is not None
    with pytest.raises(ConfigError):
        model.set_decoding(inhibit_named=-2.0)
    # a refused value changes nothing
    assert model.decoding.plugin_settings["inhibit_named"] == extension.inhibit_named == 30.0
    plain = Captioner(cfg(), Vocabulary(["a", "red", "circle"]))
    assert plain.decoder.extension.opener == -1  # no <num>: nothing to inhibit
    assert Captioner(cfg(number_last=False), Vocabulary(["a", "red", "circle"])).decoder.extension is None


@pytest.mark.integration
def test_train_caption_evaluate_and_tune_end_to_end(shapes_json, tmp_path):
    """train.py --inhibit-named saves it in the checkpoint; caption.py and captioner.evaluate take it or override
    it; scripts/tune_decoding.py picks the decoding settings on val and --write re-measures the card."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import captioner
    from tests.test_train_cli import train

    root = Path(__file__).resolve().parent.parent
    run = tmp_path / "run"
    result = train("--dataset", str(shapes_json), "--out", str(run), "--epochs", "1", "--test-splits", "test",
                   "--number-last", "--inhibit-named", "7.5", "--length-penalty", "0.5", "--repeat-penalty", "2",
                   "--plural-spread", "0.25", "--no-meteor", "--max-test-images", "4")
    assert result.returncode == 0, result.stderr[-2000:]
    model = captioner.load(run)
    settings = model.decoding.plugin_settings
    assert settings["inhibit_named"] == model.decoder.extension.inhibit_named == 7.5
    assert (model.decoding.length_penalty, settings["repeat_penalty"], settings["plural_spread"]) == (0.5, 2.0, 0.25)
    assert model.decoder.extension.opener == model.vocab.stoi[PLACEHOLDER]

    image = str(next((shapes_json.parent / "images").glob("test_*")))
    ran = subprocess.run([sys.executable, str(root / "caption.py"), "--checkpoint", str(run), "--quiet",
                          "--inhibit-named", "0", image], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and json.loads(ran.stdout)["caption"], ran.stderr[-2000:]
    bad = subprocess.run([sys.executable, str(root / "caption.py"), "--checkpoint", str(run), "--quiet",
                          "--inhibit-named", "-1", image], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "inhibit_named" in bad.stderr
    for flag in ("--repeat-penalty", "--length-penalty", "--plural-spread"):
        bad = subprocess.run([sys.executable, str(root / "caption.py"), "--checkpoint", str(run), "--quiet",
                              flag, "-1", image], capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and flag[2:].replace("-", "_") in bad.stderr

    card = {"command": "python train.py", "recipe": None, "seed": 0, "dataset": "tiny", "epochs_trained": 1,
            "results": {"test": {"train_minutes": 0.5}}, "train_config": {"model": {"inhibit_named": 7.5}}}
    (run / "card.json").write_text(json.dumps(card))
    (run / "MODEL_CARD.md").write_text("# tiny\n\nWritten by hand.\n\n| split | beam |\n|---|---|\n| test | old |\n")
    (run / "MODEL_CARD.md").write_text((run / "MODEL_CARD.md").read_text()
                                       + "\nDecoded with inhibition of return: an earlier version's line.\n")
    tune = subprocess.run([sys.executable, "-m", "scripts.tune_decoding", "--checkpoint", str(run),
                           "--dataset", str(shapes_json), "--inhibit", "0,3", "--repeat-penalties", "0,2", "--merge", "0,1",
                           "--beam-size", "2", "--cache-dir", str(tmp_path / "cache"), "--write"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert tune.returncode == 0, tune.stderr[-2000:]
    chosen_text = tune.stdout.split("chosen on val: ")[1].split(" (the checkpoint had")[0]
    chosen = dict(item.rsplit(" ", 1) for item in chosen_text.split(", "))
    assert set(chosen) == {"inhibit_named", "length_penalty", "repeat_penalty", "merge_repeats", "plural_spread"}
    inhibit, repeat = float(chosen["inhibit_named"]), float(chosen["repeat_penalty"])
    merge = bool(float(chosen["merge_repeats"]))
    grid = sorted([(i, r, m) for i in (0, 3) for r in (0, 2) for m in (0, 1)] + [(7.5, 2, 0)])
    assert (inhibit, repeat, merge) in grid
    assert float(chosen["length_penalty"]) == 0.5 and float(chosen["plural_spread"]) == 0.25  # not given: kept
    val_rows = [line.split("|")[2:6] for line in tune.stdout.splitlines() if line.startswith("| val")]
    assert sorted((float(i), float(r), float(m)) for i, _, r, m in val_rows) == grid
    # the grid and the checkpoint's own settings
    test_rows = [line for line in tune.stdout.splitlines() if line.startswith("| test |")]
    assert len(test_rows) == 1 + ((inhibit, repeat, merge) != (7.5, 2.0, False))  # the checkpoint's settings and the winner only
    written = json.loads((run / "decoding.json").read_text())["plugin_settings"]
    card = json.loads((run / "card.json").read_text())
    assert written["inhibit_named"] == card["train_config"]["model"]["inhibit_named"] == inhibit
    assert written["repeat_penalty"] == card["train_config"]["model"]["repeat_penalty"] == repeat
    assert written["merge_repeats"] is card["train_config"]["model"]["merge_repeats"] is merge  # JSON true/false
    assert set(card["results"]) == {"test", "test_novel"} and card["results"]["test"]["train_minutes"] == 0.5
    from captioner.evaluation.metrics import java_available

    assert card["results"]["test"]["images"] == 12
    assert ("METEOR" in card["results"]["test"]) == java_available()  # re-measured as train.py does
    card_md = (run / "MODEL_CARD.md").read_text()
    assert "Written by hand." in card_md and "| test | old |" not in card_md  # rows replaced, the rest kept
    assert card_md.count("| test | 2 |") == 1 and card_md.count("| test_novel | 2 |") == 0  # no row is invented
    assert "an earlier version's line" not in card_md
    assert ("Decoding settings: inhibit_named " + f"{inhibit:g}" in card_md)  # how they were chosen
    loaded = captioner.load(run)
    settings = decoding_settings(loaded.decoding.plugin_settings)
    assert (settings.inhibit_named, settings.repeat_penalty, settings.merge_repeats) == (inhibit, repeat, merge)
    bad = subprocess.run([sys.executable, "-m", "scripts.tune_decoding", "--checkpoint", str(run),
                          "--length-penalties", "1,x"], cwd=root, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--length-penalties" in bad.stderr and bad.stderr.count("\n") == 1


@pytest.mark.parametrize("drop", [False, True], ids=["grouped rows", "finished rows dropped"])
def test_scst_samples_can_be_drawn_with_inhibition(drop, monkeypatch):
    """--scst-inhibit: the training-mode samples carry the named state through every step, whether finished rows
    leave the batch or not; without it training never inhibits."""
    import captioner.training.scst as scst

    monkeypatch.setattr(scst, "drops_finished_rows", lambda decoder, annotations: drop)
    dec = decoder(50.0, seed=5).train()
    ann = torch.randn(3, GRID * GRID, 8, generator=torch.Generator().manual_seed(6)) * 3
    seen = []
    step = Decoder.step

    def spy(self, words, state, use_sample=None):
        seen.append(state.extra is not None)
        return step(self, words, state, use_sample)

    monkeypatch.setattr(Decoder, "step", spy)
    torch.manual_seed(0)
    plain = scst.sample_captions(dec, ann, 4, VOCAB.start_index, VOCAB.end_index, 12)
    assert seen and not any(seen)
    seen.clear()
    torch.manual_seed(0)
    inhibited = scst.sample_captions(dec, ann, 4, VOCAB.start_index, VOCAB.end_index, 12, as_decoded=True)
    assert seen and all(seen)
    assert inhibited.words.shape[0] == plain.words.shape[0] == 12
    inhibited.log_probs[inhibited.mask].sum().backward()  # the words' gradient still flows
    assert dec.embedding.weight.grad is not None


def test_scst_inhibit_needs_a_weight():
    from captioner.training.config import TrainConfig
    from captioner.training.recipes import SettingError

    cfg = TrainConfig().updated({"model": {"number_last": True}})
    cfg.plugin["scst_inhibit"] = True
    with pytest.raises(SettingError, match="--scst-inhibit needs --inhibit-named"):
        cfg.validate()


def test_no_number_last_switches_a_recipes_inhibition_off_but_not_a_flags(capsys):
    from captioner.commands.train import get_args_parser as train_parser
    from captioner.training.flags import from_args
    from captioner.training.recipes import SettingError

    cfg = from_args(train_parser().parse_args(["--config", "shapes-soft", "--no-number-last"]))
    assert (cfg.model.plugin_config.get("number_last"), cfg.decoding.plugin_settings.get("inhibit_named")) == (False, 0.0)
    hard = from_args(train_parser().parse_args(["--config", "shapes-hard"]))
    assert hard.decoding.plugin_settings.get("inhibit_named") == 10.0
    given = from_args(train_parser().parse_args(["--config", "shapes-soft", "--no-number-last", "--inhibit-named",
                                                 "3"]))
    with pytest.raises((ConfigError, SettingError), match="inhibit_named|inhibit-named"):
        given.validate()
