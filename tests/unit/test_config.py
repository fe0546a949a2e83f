import pytest
import yaml

from diffscale import config as C
from diffscale.cli import main
from diffscale.config.presets import PRESETS, get_preset
from diffscale.errors import UserError


def test_presets_keep_the_reference_widths():
    expected = {
        "small": (28, (32, 64, 128), (False, True, True), 2048),
        "medium": (64, (64, 128, 256, 256), (False, False, True, False), 384),
        "large": (96, (128, 128, 256, 256, 512), (False, False, False, True, False), 96),
        "xl": (128, (128, 128, 256, 256, 512, 512), (False, False, False, False, True, False), 32),
    }
    for name, (px, widths, attention, batch) in expected.items():
        cfg = get_preset(name)
        assert (cfg.model.sample_size, cfg.model.block_out_channels, cfg.model.attention, cfg.train.batch_per_gpu) == (
            px, widths, attention, batch)
        assert cfg.model.layers_per_block == 2
    assert set(PRESETS) == {"tiny", "small", "medium", "large", "xl", "field-icon", "field-large", "policy",
                            "policy-tiny"}


def test_image_presets_predict_the_velocity_and_a_written_run_keeps_its_own_target():
    for name in ("tiny", "small", "medium", "large", "xl"):
        assert get_preset(name).diffusion.prediction_type == C.Prediction.V_PREDICTION, name
    # the config.yaml of an xl run written while xl predicted the noise resumes predicting the noise
    written = get_preset("xl").to_yaml()
    assert "prediction_type: v_prediction" in written
    before = C.from_dict(yaml.safe_load(written.replace("prediction_type: v_prediction", "prediction_type: epsilon")))
    assert before.diffusion.prediction_type == C.Prediction.EPSILON


def test_yaml_round_trip_is_identity():
    for name in PRESETS:
        cfg = get_preset(name)
        assert C.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg


def test_overrides_parse_types():
    cfg = C.merge(get_preset("tiny"), C.parse_overrides(
        ["train.steps=7", "model.attention=[false,true,false]", "optim.lr=1e-3", "runtime.device=cpu"]))
    assert cfg.train.steps == 7 and cfg.model.attention == (False, True, False)
    assert cfg.optim.lr == 1e-3 and cfg.runtime.device == C.Device.CPU


def test_on_off_switches_survive_yaml_booleans():
    # YAML reads on/off/yes/no as booleans; a switch must still accept them.
    cfg = C.merge(get_preset("tiny"), C.parse_overrides(
        ["runtime.channels_last=off", "runtime.compile=on", "runtime.compile_mode=max-autotune-no-cudagraphs"]))
    assert cfg.runtime.channels_last == C.Toggle.OFF and cfg.runtime.compile == C.Toggle.ON
    assert cfg.runtime.compile_mode == C.CompileMode.MAX_AUTOTUNE


@pytest.mark.parametrize("override, message", [
    ("train.stpes=3", "unknown config key 'train.stpes' (did you mean 'steps'?)"),
    ("trian.steps=3", "unknown config key 'trian' (did you mean 'train'?)"),
    ("train.steps=abc", "config train.steps: expected a whole number, got 'abc'"),
    ("train.batch_per_gpu=0", "config train.batch_per_gpu: must be at least 1 (got 0)"),
    ("optim.lr=5", "config optim.lr: 5.0 is outside (0, 1)"),
    ("runtime.compile_mode=fastest", "config runtime.compile_mode: 'fastest' is not one of auto, default"),
    ("runtime.precision=fp8", "config runtime.precision: 'fp8' is not one of auto, fp32, bf16, fp16"),
    ("model.sample_size=30", "config model.sample_size: 30 px cannot be halved 2 times by a 3-level UNet"),
    ("model.attention=[true]", "config model.attention: has 1 entries but model.block_out_channels has 3"),
    ("diffusion.loss_weighting=snr", "config diffusion.loss_weighting: 'snr' is not one of none, min-snr"),
    ("diffusion.min_snr_gamma=0", "config diffusion.min_snr_gamma: must be positive (got 0.0)"),
    ("train.divergence_noise=-1", "config train.divergence_noise: must be 0 or a positive number of noise widths"),
    ("train.divergence_noise=inf", "config train.divergence_noise: must be 0 or a positive number of noise widths"),
])
def test_bad_config_values_are_named_with_a_fix(override, message):
    with pytest.raises(UserError) as info:
        C.merge(get_preset("tiny"), C.parse_overrides([override]))
    assert info.value.message.startswith(message)
    assert " -- " in info.value.message  # always a fix


def test_cli_prints_one_line_and_exits_2(capsys):
    assert main(["train", "--preset", "smal"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: unknown preset 'smal' (did you mean 'small'?) -- choose one of: "
                           "tiny, small, medium, large, xl, field-icon, field-large, policy, policy-tiny "
                           "(see `diffscale presets`)")
    assert "Traceback" not in err


def test_missing_and_invalid_config_files(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "config file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    assert main(["train", str(bad)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err


def test_dry_run_prints_resolved_config(capsys):
    assert main(["train", "--preset", "small", "--set", "train.steps=5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert data["train"]["steps"] == 5 and data["model"]["block_out_channels"] == [32, 64, 128]


def test_presets_table(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert "widths 32/64/128" in out and "2048" in out and "images" in out


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_presets_stated_parameter_count_is_its_networks(name):
    """`diffscale presets` prints PresetInfo.params without building networks (no torch)."""
    import torch

    from diffscale.tasks.base import count_parameters
    from diffscale.tasks.registry import build_task

    with torch.device("meta"):
        network = build_task(get_preset(name), torch.device("meta"), load_data=False).build_network()
    assert count_parameters(network) == PRESETS[name].params


@pytest.mark.parametrize("width", [33, 2, 0])
def test_policy_step_embedding_width_must_be_even_and_at_least_4(width):
    # 33 crashed in the first training step (a 32-wide embedding fed a 33-wide layer), 2 divided by zero
    with pytest.raises(UserError) as info:
        C.merge(get_preset("policy-tiny"), C.parse_overrides([f"model.step_embed_dim={width}"]))
    assert info.value.message.startswith(f"config model.step_embed_dim: {width} is not an even number of at least 4 "
                                         "-- use an even width such as")


def test_the_smallest_step_embedding_width_builds_a_working_network():
    import torch

    from diffscale.tasks.policy.network import build_unet1d

    cfg = C.merge(get_preset("policy-tiny"), C.parse_overrides(["model.step_embed_dim=4"]))
    net = build_unet1d(cfg.model, 4, 2)
    out = net(torch.randn(3, 16, 2), torch.tensor([0, 50, 99]), torch.randn(3, 2 * 4))
    assert out.shape == (3, 16, 2) and torch.isfinite(out).all()


@pytest.mark.parametrize("preset", ["policy-tiny", "field-icon"])
@pytest.mark.parametrize("override, value, off", [("data.shift_px=3", "3", "0"), ("data.hflip=true", "true", "false")])
def test_image_augmentations_are_refused_for_other_tasks(preset, override, value, off, capsys):
    name = override.split("=")[0]
    task = get_preset(preset).task
    assert main(["train", "--preset", preset, "--set", override, "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: config {name}: {value} is an image augmentation (task images only); this run's task is {task}, "
        f"where it would do nothing -- drop {name} from --set or the config file, or set it to {off}")


def test_image_augmentations_stay_for_images_and_for_an_images_preset_switched_to_another_task(tmp_path):
    assert C.resolve_config(C.ConfigSources(preset="tiny", overrides=["data.shift_px=3", "data.hflip=true"]))
    switched = C.resolve_config(C.ConfigSources(preset="tiny", overrides=["task=policy"]))
    assert switched.data.shift_px == get_preset("tiny").data.shift_px  # the preset's, not the user's: kept
    config = tmp_path / "config.yaml"
    C.write_yaml(switched, config)  # that run's own config.yaml resumes
    assert C.resolve_config(C.ConfigSources(config_file=config)).task == "policy"
    off = C.resolve_config(C.ConfigSources(preset="policy-tiny", overrides=["data.shift_px=0", "data.hflip=false"]))
    assert off.data.shift_px == 0 and off.data.hflip is False


def test_sampling_defaults_to_the_task_s_sampler_then_the_run_s_own():
    train = C.TrainConfig(sample_sampler=C.SamplerName.DPMSOLVER, sample_steps=7)
    assert train.sampling(None, None) == ("dpmsolver", 7)  # diffscale sample, images and fields eval
    assert train.sampling(None, None, task_sampler="ddpm") == ("ddpm", 7)  # a policy's eval and controller
    assert train.sampling("ddim", 3, task_sampler="ddpm") == ("ddim", 3)  # what the caller names wins
