"""Class-conditional image runs with classifier-free guidance: labels drawn with the batch (label
dropout, exact resume), guidance in the one sampling path (its identities, every sampler), the
classes a user asks for, the grid's rows, training that draws the asked classes, export and
``diffscale sample --class``. One conditional run of the built-in numerals is shared."""

import json

import pytest
import torch

from diffscale.cli import main
from diffscale.config import ConfigSources, resolve_config
from diffscale.diffusion.sampler import Conditioned, guided
from diffscale.errors import UserError
from diffscale.inference.trained import load_trained
from diffscale.runtime import checkpoint as ckpt
from diffscale.tasks.images import quality
from diffscale.tasks.images.classes import grid_labels, pick_classes, spread
from diffscale.tasks.images.task import ImageTask

from helpers import MICRO, emnist_letters, micro_args

CPU = torch.device("cpu")
CLASSES = ["model.class_conditional=on"]
LEARN_STEPS = 80
# Enough for the numerals' classes to show at 8 px in few steps: the network predicts the clean
# image (its early predictions are each class's blurred mean, which the classifier tells apart, where
# early noise predictions sample noise), a wider UNet than the micro one, a fast EMA; one quality
# evaluation at the end of training.
LEARNS = [*CLASSES, "diffusion.prediction_type=sample", "model.block_out_channels=[16,32]",
          "model.attention=[false,false]", "train.batch_per_gpu=64", "optim.lr=3e-3", "train.ema_decay=0.8",
          "train.checkpoint_every=1000", "train.log_every=100", f"train.eval_every={LEARN_STEPS}",
          "train.eval_count=20"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A class-conditional run of the built-in numerals (classes 0-9), trained until its samples
    are of the asked class. Its feature network is its own (a cache of this module's, not one
    another test trained for a few steps), trained 100 steps: a held-out accuracy of 1 on these
    images, in half the time of the default."""
    run = tmp_path_factory.mktemp("classes") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIFFSCALE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        patch.setattr(quality, "TRAIN_STEPS", 100)
        assert main(["train", "--out", str(run), *micro_args(*LEARNS, steps=LEARN_STEPS)]) == 0
        yield run


def _task(*overrides):
    return ImageTask(resolve_config(ConfigSources(device="cpu", overrides=[*MICRO, *overrides])), CPU)


def test_asked_classes_are_resolved_by_name_then_index_and_laid_out_in_grid_rows():
    names = [str(d) for d in range(10)]
    assert pick_classes(["3,7", "9"], names) == [3, 7, 9]
    assert pick_classes(["b", "0"], ["a", "b"]) == [1, 0]
    assert pick_classes(["1"], ["x", "1"]) == [1]  # a class named "1" before index 1
    with pytest.raises(UserError, match=r"--class '12' is not a class of this run \(its classes: 0, 1, 2"):
        pick_classes(["12"], names)
    many = [f"c{i}" for i in range(30)]
    with pytest.raises(UserError, match=r"c11, \.\.\. \(30 in all\)"):
        pick_classes(["nope"], many)
    # 64 samples: an 8 x 8 grid, one class a row, 8 of 10 classes spread evenly
    labels = grid_labels(spread(10, 64), 64).view(8, 8)
    assert (labels == labels[:, :1]).all() and labels[:, 0].tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert grid_labels(spread(3, 64), 64).view(8, 8)[:, 0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    assert grid_labels([4, 2], 6).tolist() == [4, 4, 4, 2, 2, 2]  # 2 x 3 grid: a row each
    assert grid_labels(list(range(5)), 4).tolist() == [0, 1, 2, 3]  # more classes than rows: a block of samples each


def test_kernel_cache_keys_of_unconditional_runs_are_as_before_and_the_switch_changes_them():
    plain = resolve_config(ConfigSources(device="cpu", overrides=MICRO))
    conditional = resolve_config(ConfigSources(device="cpu", overrides=[*MICRO, *CLASSES]))
    before = {k: v for k, v in plain.to_dict()["model"].items() if k not in ("class_conditional", "label_dropout")}
    assert plain.model_key() == before
    assert conditional.model_key() == {**before, "class_conditional": True}


def test_labels_are_drawn_last_with_the_batch_and_dropped_at_the_set_rate():
    plain, conditional = _task(), _task(*CLASSES)
    assert conditional.class_names == [str(d) for d in range(10)] and not plain.class_names
    indices = torch.randint(0, conditional.num_items(), (5_000,), generator=torch.Generator().manual_seed(0))
    a = plain.draw(indices, torch.Generator().manual_seed(1))
    b = conditional.draw(indices, torch.Generator().manual_seed(1))
    assert set(b) == set(a) | {"labels"}
    for key in a:  # an unconditional run's draws are as they were
        assert torch.equal(a[key], b[key]), key
    dropped = b["labels"] == 10
    assert 0.085 < dropped.float().mean() < 0.115
    assert torch.equal(b["labels"][~dropped], conditional.labels[indices][~dropped])
    again = conditional.draw(indices, torch.Generator().manual_seed(1), out={k: torch.empty_like(v)
                                                                             for k, v in b.items()})
    assert torch.equal(again["labels"], b["labels"])  # into a recorded step's inputs: the same draws
    network = conditional.build_network()
    assert network.unet.class_embedding.num_embeddings == 11  # ten classes and "no class"


def test_guidance_combines_one_doubled_call_and_scales_one_and_zero_call_one_prediction():
    torch.manual_seed(0)
    task = _task(*CLASSES)
    network = task.build_network().eval()
    x, t = torch.randn(4, 1, 8, 8), torch.tensor([10, 200, 500, 900])
    labels, none = torch.tensor([0, 3, 5, 9]), torch.full((4,), 10)
    with torch.no_grad():
        eps_c, eps_u = network(x, t, labels), network(x, t, none)
        assert torch.equal(guided(network, x, t, (labels,), (none,), 1.0), eps_c)
        assert torch.equal(guided(network, x, t, (labels,), (none,), 0.0), eps_u)
        assert torch.equal(guided(network, x, t, (labels,), None, 3.0), eps_c)  # nothing to guide from
        combined = guided(network, x, t, (labels,), (none,), 3.0)
    torch.testing.assert_close(combined, eps_u + 3.0 * (eps_c - eps_u), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(combined, eps_c, atol=1e-3)


@pytest.mark.parametrize("sampler", ["ddim", "ddpm", "dpmsolver"])
def test_sampling_at_guidance_one_is_the_conditional_path_and_guidance_changes_it(sampler):
    from diffscale.diffusion import Sampler, SamplerKind, sample

    torch.manual_seed(0)
    task = _task(*CLASSES)
    network = task.build_network().eval()

    def draw(guidance):
        return task.generate(network, count=4, steps=4, seed=5, sampler=sampler, classes=["2", "7"],
                             guidance=guidance).samples

    start = torch.randn((4, 1, 8, 8), generator=(generator := torch.Generator().manual_seed(5)))
    labels = torch.tensor([2, 2, 7, 7])
    conditional_only, _ = sample(Conditioned(network, (labels,)), task.diffusion, (4, 1, 8, 8),
                                 sampler=Sampler(SamplerKind(sampler), 4), generator=generator, device=CPU,
                                 x_init=start)
    assert torch.equal(draw(1.0), conditional_only)
    assert not torch.allclose(draw(4.0), conditional_only, atol=1e-3)
    assert torch.equal(draw(4.0), draw(4.0))  # seeded


def test_the_recorded_ddim_loop_guides_as_the_per_call_loop_does():
    """The loop body ``InferenceNetwork`` records as one CUDA graph, run here without recording."""
    from diffscale.diffusion import Sampler, sample
    from diffscale.diffusion.sampler import ddim_loop

    class Recordable:  # what a recorded loop calls on an InferenceNetwork
        def __init__(self, network):
            self.loop_step = network

    torch.manual_seed(0)
    task = _task(*CLASSES)
    network = task.build_network().eval()
    start = torch.randn((4, 1, 8, 8), generator=torch.Generator().manual_seed(3))
    labels, none = torch.tensor([1, 1, 6, 6]), torch.full((4,), 10)
    with torch.no_grad():
        looped = ddim_loop(Recordable(network), task.diffusion, 4, 3.0)(start.clone(), (labels, none))
    per_call, _ = sample(Conditioned(network, (labels,), None, (none,), 3.0), task.diffusion, (4, 1, 8, 8),
                         sampler=Sampler(steps=4), generator=torch.Generator(), device=CPU, x_init=start)
    torch.testing.assert_close(looped.clamp(-1, 1), per_call, rtol=1e-5, atol=1e-5)


def test_a_conditional_preview_shows_classes_in_rows_and_ranks_share_it_exactly():
    torch.manual_seed(0)
    task = _task(*CLASSES)
    network = task.build_network().eval()
    whole = task.generate(network, count=6, steps=3, seed=1).samples
    # 6 samples: a 2 x 3 grid, rows of the classes 0 and 5
    assert torch.equal(whole, task.generate(network, count=6, steps=3, seed=1, classes=["0", "5"]).samples)
    parts = [task.generate(network, count=6, steps=3, seed=1, rows=slice(r * 3, r * 3 + 3)).samples for r in (0, 1)]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-6)


def test_a_resumed_conditional_run_is_bit_for_bit_the_uninterrupted_one(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", "--out", str(straight), *micro_args(*CLASSES, steps=6)]) == 0
    assert main(["train", "--out", str(split), "--max-steps", "4", *micro_args(*CLASSES, steps=6)]) == 0
    assert main(["train", "--out", str(split), "--resume", "auto", *micro_args(*CLASSES, steps=6)]) == 0
    a, b = (ckpt.load_checkpoint(ckpt.list_checkpoints(run)[-1]) for run in (straight, split))
    assert a.step == b.step == 6 and a.ema.keys() == b.ema.keys()
    assert any("class_embedding" in key for key in a.ema)
    for key in a.ema:
        assert torch.equal(a.ema[key], b.ema[key]), key


def test_samples_of_a_conditional_run_are_the_asked_classes(trained, capsys):
    """The data's classifier finds the asked class in far more samples than chance (1 in 10), and
    in more with guidance than without (``eval --guidance 0``; measured: 0.13 unguided, 0.37 at the
    default scale 2)."""
    capsys.readouterr()
    assert main(["eval", str(trained), "--count", "100", "--steps", "10", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["guidance"] == 2.0 and record["class_accuracy"] > 0.25, record
    assert record["feature_net_accuracy"] > 0.9, record
    assert main(["eval", str(trained), "--count", "100", "--steps", "10", "--guidance", "0", "--json"]) == 0
    unguided = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert unguided["guidance"] == 0.0 and unguided["class_accuracy"] < record["class_accuracy"] - 0.1, unguided
    run = load_trained(trained, "cpu")
    assert run.cfg.train.sample_guidance == 2.0  # eval --guidance leaves the run's default as it is
    while_training = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert {"class_accuracy", "guidance"} <= next(r for r in while_training if r.get("count") == 20).keys()


def test_sample_draws_the_asked_classes_from_the_command_line(trained, tmp_path, capsys):
    out = tmp_path / "sevens.png"
    assert main(["sample", str(trained), "--class", "7", "--n", "4", "--steps", "3", "--guidance", "3",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    assert main(["sample", str(trained), "--class", "1,8", "--class", "3", "--n", "9", "--steps", "3"]) == 0
    written = capsys.readouterr().out.strip()
    assert written.endswith(f"samples/sample_step{LEARN_STEPS:08d}_seed0_dpmsolver3_class1-8-3.png"), written


def test_export_keeps_the_classes_and_samples_a_class(trained, tmp_path, capsys):
    from diffscale.tasks.images.exported import load_export

    out = tmp_path / "export"
    assert main(["export", str(trained), "--diffusers", str(out)]) == 0
    assert "custom_pipeline" in capsys.readouterr().out
    assert json.loads((out / "signature.json").read_text())["classes"] == [str(d) for d in range(10)]
    card = (out / "README.md").read_text()
    assert "its 10 classes (pipe.config.class_names): 0, 1, 2, 3, 4, 5, 6, 7, 8, 9" in card
    assert "class-conditional" in card
    task, network = load_export(out)
    assert task.class_names == [str(d) for d in range(10)]
    run = load_trained(trained, "cpu")
    ours = task.generate(network, count=4, steps=3, seed=2, classes=["5"]).samples
    theirs = run.task.generate(run.network, count=4, steps=3, seed=2, classes=["5"]).samples
    assert torch.equal(ours, theirs)


def test_emnist_letters_train_a_conditional_run_that_samples_a_letter(tmp_path, capsys):
    root = emnist_letters(tmp_path / "emnist", [1 + i % 26 for i in range(52)])
    run = tmp_path / "run"
    assert main(["train", "--data", f"emnist:{root}:letters", "--out", str(run), *micro_args(*CLASSES, steps=4)]) == 0
    trained = load_trained(run, "cpu")
    assert trained.task.class_names == list("abcdefghijklmnopqrstuvwxyz")
    assert trained.network.unet.class_embedding.num_embeddings == 27  # 26 letters and "no class"
    task = ImageTask(resolve_config(ConfigSources(device="cpu", data=f"emnist:{root}:letters",
                                                  overrides=[*MICRO, *CLASSES])), CPU)
    assert task.labels.tolist() == [i % 26 for i in range(52)]
    capsys.readouterr()
    assert main(["sample", str(run), "--class", "b", "--n", "4", "--steps", "3"]) == 0
    written = capsys.readouterr().out.strip()
    assert written.endswith("_classb.png") and (run / "samples" / written.rsplit("/", 1)[-1]).is_file(), written


def test_the_sampling_memory_estimate_counts_the_doubled_batch_of_guidance():
    from diffscale.inference.sample import bytes_per_sample

    torch.manual_seed(0)
    task = _task(*CLASSES)
    network = task.build_network()
    one_call = bytes_per_sample(task, network, classes=["3"], guidance=1.0)
    assert bytes_per_sample(task, network, classes=["3"], guidance=0.0) == one_call  # the unconditional call alone
    guided_call = bytes_per_sample(task, network, classes=["3"], guidance=3.0)
    sample = 8 * 8 * 4
    # the output and the activations twice over; the sample and its noise once
    assert guided_call - 2 * sample == 2 * (one_call - 2 * sample), (one_call, guided_call)
    assert bytes_per_sample(task, network) == guided_call  # the run's default scale, 2, guides too
    plain = _task()
    assert bytes_per_sample(plain, plain.build_network()) < guided_call


def test_the_export_samples_a_class_with_diffusers_alone(trained, tmp_path, capsys):
    """The folder carries its pipeline (pipeline.py): the real diffusers loads and samples it by
    class, without diffscale, and draws diffscale's images from the same start noise."""
    from diffusers import DDIMScheduler, DiffusionPipeline

    out = tmp_path / "export"
    assert main(["export", str(trained), "--diffusers", str(out)]) == 0
    assert f"custom_pipeline='{out}'" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "DiffusionPipeline.from_pretrained(folder, custom_pipeline=folder," in card and str(tmp_path) not in card
    pipe = DiffusionPipeline.from_pretrained(str(out), custom_pipeline=str(out), trust_remote_code=True)
    assert type(pipe).__name__ == "ClassConditionalPipeline"
    source = (out / "pipeline.py").read_text()
    assert "import diffscale" not in source and "from diffscale" not in source
    assert list(pipe.config.class_names) == [str(d) for d in range(10)]
    images = pipe(class_labels=["5", 7], num_inference_steps=3, generator=torch.Generator().manual_seed(0)).images
    assert len(images) == 2 and images[0].size == (8, 8)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    start = torch.randn((4, 1, 8, 8), generator=torch.Generator().manual_seed(2))
    theirs = pipe(class_labels=["5"] * 4, num_inference_steps=3, latents=start, output_type="pt").images
    run = load_trained(trained, "cpu")
    ours = run.task.generate(run.network, count=4, steps=3, seed=2, classes=["5"], sampler="ddim").samples
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="class 'Z' is not one of this model's 10 classes"):
        pipe(class_labels=["Z"], num_inference_steps=1)
