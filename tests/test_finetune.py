"""Cache vs images give the same loss; fine-tuning touches only the chosen stages; augmentation keeps left/right."""

import copy
import json
import subprocess
import sys

import pytest
import torch
from PIL import Image

from captioner.training.augment import augmented_transform, caption_augmentation
from captioner.model.config import ModelConfig
from captioner.data.cache import FeatureCache
from captioner.data.karpathy import ImageFileLoader, KarpathySplit
from captioner.errors import CaptionerError
from captioner.model.captioner import Captioner
from captioner.training import LoopSettings, make_caption_loader, train_one_epoch
from captioner.vocab import Vocabulary

TINY = dict(hidden_dim=32, embed_dim=16, attention_dim=16)


def frozen_lite0(vocab: Vocabulary, seed: int = 0) -> Captioner:
    """Random EfficientNet-Lite0 weights, frozen: cacheable without any download."""
    torch.manual_seed(seed)
    model = Captioner(ModelConfig(encoder="efficientnet_lite0", encoder_weights=None, **TINY), vocab,
                      encoder_weights=None)
    assert model.encoder.trainable_from is None
    return model


@pytest.fixture
def tiny_train(shapes_json):
    split = KarpathySplit.load(shapes_json, "train")
    split.records = split.records[:3]
    return split, Vocabulary.build(split.all_tokens(), min_count=1)


def _epoch(model, loader):
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(123)  # same dropout masks in both runs
    settings = LoopSettings(lambda_ds=1.0, grad_clip=5.0, progress=False)
    return train_one_epoch(model, loader, optimizer, settings)["loss"]


def test_training_from_cache_equals_training_from_images(tiny_train, tmp_path):
    split, vocab = tiny_train
    model = frozen_lite0(vocab)
    cache = FeatureCache.open_or_build(model, split, tmp_path / "cache", progress=False)
    images = ImageFileLoader(split.image_paths, model.preprocessing.transform())
    from_cache, from_images = copy.deepcopy(model), copy.deepcopy(model)
    loss_cache = _epoch(from_cache, make_caption_loader(split, vocab, cache, 5, shuffle=False, seed=0))
    loss_images = _epoch(from_images, make_caption_loader(split, vocab, images, 5, shuffle=False, seed=0))
    assert loss_cache == pytest.approx(loss_images, abs=2e-3)  # float16 features: not bit-equal
    # Both runs moved the decoder the same way; a different seed would not (dropout masks differ).
    for (name, a), b in zip(from_cache.decoder.named_parameters(), from_images.decoder.parameters()):
        if name.endswith("full_att.bias"):  # shifts every score alike: its true gradient is 0, so Adam's step
            continue                        # (+-lr whatever the size) follows the sign of rounding noise
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-2)
    other = copy.deepcopy(model)
    optimizer = torch.optim.Adam([p for p in other.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(7)
    loss_other = train_one_epoch(other, make_caption_loader(split, vocab, cache, 5, shuffle=False, seed=0),
                                 optimizer, LoopSettings(lambda_ds=1.0, grad_clip=5.0, progress=False))["loss"]
    assert abs(loss_other - loss_cache) > 1e-4


def test_fine_tuning_updates_only_the_chosen_stages(tiny_train):
    from captioner.training.config import TrainConfig
    from captioner.training.fit import start_fine_tuning

    split, vocab = tiny_train
    model = frozen_lite0(vocab)
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=1e-3)
    cfg = TrainConfig().updated({"model": {"fine_tune_from": 4}, "optim": {"encoder_lr": 1e-2}})
    start_fine_tuning(model, optimizer, cfg)
    assert model.cfg.fine_tune_from == 4 and len(optimizer.param_groups) == 2
    assert optimizer.param_groups[1]["lr"] == 1e-2
    before = [copy.deepcopy(stage.state_dict()) for stage in model.encoder.stages]
    loader = make_caption_loader(split, vocab, ImageFileLoader(split.image_paths, model.preprocessing.transform()),
                                 8, shuffle=True, seed=0)
    train_one_epoch(model, loader, optimizer, LoopSettings(lambda_ds=1.0, grad_clip=5.0, progress=False))
    for i, (stage, old) in enumerate(zip(model.encoder.stages, before)):
        new = stage.state_dict()
        same = all(torch.equal(new[k], old[k]) for k in old)  # parameters and BatchNorm statistics
        assert same == (i < 4), f"stage {i} {'changed' if not same else 'did not change'}"


def test_augmentation_never_mirrors():
    image = Image.new("RGB", (64, 64), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 32, 64))  # red left half, blue right half
    augment = caption_augmentation()
    assert "Flip" not in repr(augment)
    torch.manual_seed(0)
    for _ in range(20):
        out = augment(image)
        assert out.size == image.size
        red_left = torch.tensor(list(out.crop((4, 8, 24, 56)).getdata())).float().mean(0)
        red_right = torch.tensor(list(out.crop((40, 8, 60, 56)).getdata())).float().mean(0)
        assert red_left[0] > red_left[2] and red_right[2] > red_right[0]
    from captioner.encoders import ENCODERS

    tensor = augmented_transform(ENCODERS["efficientnet_lite0"].preprocessing)(image)
    assert tensor.shape == (3, 224, 224)


def _train_cmd(shapes_json, tmp_path, *extra):
    return [sys.executable, "train.py", "--dataset", str(shapes_json), "--encoder", "efficientnet_lite0",
            "--max-train-images", "4", "--max-val-images", "2", "--batch-size", "10", "--min-word-count", "1",
            "--hidden-dim", "32", "--embed-dim", "16", "--attention-dim", "16", "--metric", "BLEU-4",
            "--test-splits", "", "--no-progress", "--threads", "2", "--out", str(tmp_path / "run"),
            "--cache-dir", str(tmp_path / "cache"), *extra]


@pytest.mark.slow  # ~15 s idle, a minute on a loaded 2-core machine: `make test-all`
def test_train_fine_tune_after_switches_from_cache_to_images(shapes_json, tmp_path):
    from captioner.checkpoints.loading import load
    from captioner.encoders import build_encoder

    done = subprocess.run(_train_cmd(shapes_json, tmp_path, "--epochs", "2", "--fine-tune-after", "1",
                                     "--fine-tune-from", "5", "--encoder-lr", "1e-3", "--augment"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fine-tuning encoder stages 5+" in done.stdout
    assert list((tmp_path / "cache").glob("*/meta.json"))  # epoch 1 ran on cached features
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    tuned = load(tmp_path / "run" / "last")
    assert tuned.cfg.fine_tune_from == 5
    pretrained = build_encoder("efficientnet_lite0", weights="package")
    for i, (a, b) in enumerate(zip(tuned.encoder.stages, pretrained.stages)):
        same = all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
        assert same == (i < 5), f"stage {i}"


def test_train_flag_errors(shapes_json, tmp_path):
    from captioner.commands.train import get_args_parser, main

    parser = get_args_parser()
    with pytest.raises(CaptionerError, match="--fine-tune-from"):
        main(parser.parse_args(_train_cmd(shapes_json, tmp_path, "--fine-tune-after", "1")[2:]))
    with pytest.raises(CaptionerError, match="--augment needs images"):
        main(parser.parse_args(_train_cmd(shapes_json, tmp_path, "--augment", "--cache", "on")[2:]))


def test_cpu_encoder_chunks_give_the_batch_result():
    """A frozen encoder on CPU encodes images in chunks (faster there); the result is the whole batch's."""
    from captioner.encoders import build_encoder

    torch.manual_seed(0)
    encoder = build_encoder("efficientnet_lite0_ms", weights=None, grid=14)
    images = torch.randn(5, 3, 64, 64)
    with torch.no_grad():
        whole = encoder.forward_all(images)
        for chunk in (1, 2, 0):  # 0: no chunking
            encoder.cpu_chunk = chunk
            assert torch.allclose(encoder(images), whole, atol=1e-4)
    encoder.fine_tune(3)
    encoder.train()  # a trainable stage's BatchNorm uses batch statistics: never chunked
    calls = []
    hook = encoder.stages[0].register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    encoder.cpu_chunk = 1
    encoder(images)
    hook.remove()
    assert calls == [5]
