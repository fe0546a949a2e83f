"""Sampling from a run and exporting it for diffusers."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffscale.cli import main

from helpers import micro_args, required


def _trained(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args(steps=4)]) == 0
    return run


def test_sample_writes_reproducible_grids_and_a_gif(tmp_path, capsys):
    run = _trained(tmp_path)
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "4", "--steps", "3", "--seed", "7", "--gif",
                 "--out", str(tmp_path / "a.png")]) == 0
    printed = capsys.readouterr().out.split()
    assert str(tmp_path / "a.png") in printed and str(tmp_path / "a.gif") in printed
    assert main(["sample", str(run), "--n", "4", "--steps", "3", "--seed", "7", "--out", str(tmp_path / "b.png")]) == 0
    with Image.open(tmp_path / "a.png") as a, Image.open(tmp_path / "b.png") as b:
        assert (np.asarray(a) == np.asarray(b)).all()  # same seed, same images
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames > 2
    assert main(["sample", str(run), "--n", "2", "--steps", "3", "--sampler", "ddpm",
                 "--out", str(tmp_path / "c.png")]) == 0


def test_sample_shows_progress_on_stderr_and_says_when_it_cannot_write_mp4(tmp_path, capsys, monkeypatch):
    import diffscale.io.media

    run = _trained(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr(diffscale.io.media, "mp4_writer_installed", lambda: False)
    out = tmp_path / "d.png"
    assert main(["sample", str(run), "--n", "2", "--steps", "4", "--sampler", "ddpm", "--gif", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(out), str(out.with_suffix(".gif"))]  # stdout: only the files
    err = captured.err.splitlines()
    assert err[0] == "sampling: 2 samples, ddpm, 4 steps"
    assert any(line.startswith("sampling: step 4/4 (100%)") for line in err)
    assert err[-1] == ("note: no MP4 writer is installed, so only the GIF was written -- pip install imageio-ffmpeg "
                       "(or diffscale[video]): it ships its own ffmpeg binary")
    assert not out.with_suffix(".mp4").exists()


def test_sample_writes_an_mp4_where_imageio_ffmpeg_is_installed(tmp_path, capsys):
    required("imageio_ffmpeg")  # the test extra installs it (diffscale[video] for users)
    run = _trained(tmp_path)
    out = tmp_path / "e.png"
    assert main(["sample", str(run), "--n", "2", "--steps", "3", "--gif", "--out", str(out)]) == 0
    assert str(out.with_suffix(".mp4")) in capsys.readouterr().out.split()
    assert out.with_suffix(".mp4").stat().st_size > 0


@pytest.mark.parametrize("sampler", ["ddim", "dpmsolver", "ddpm"])
def test_sample_names_its_file_by_the_steps_it_ran_and_says_when_it_capped_them(sampler, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("diffusion.num_train_timesteps=20", steps=4)]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "2", "--steps", "50", "--sampler", sampler]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(run / "samples" / f"sample_step00000004_seed0_{sampler}20.png")]
    err = captured.err.splitlines()
    assert err[0] == "note: --steps 50 is more than the 20 timesteps this run was trained with: sampling 20 steps"
    assert err[1] == f"sampling: 2 samples, {sampler}, 20 steps"


def test_sample_defaults_to_the_runs_own_sampler_and_steps(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *micro_args("train.sample_steps=4", steps=4)]) == 0
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "2"]) == 0  # a new run's choice: DPM-Solver++
    assert capsys.readouterr().out.split() == [str(run / "samples" / "sample_step00000004_seed0_dpmsolver4.png")]
    config = run / "config.yaml"  # a run trained before the switch keeps the DDIM it sampled with
    config.write_text(config.read_text().replace("sample_sampler: dpmsolver", "sample_sampler: ddim"))
    assert main(["sample", str(run), "--n", "2", "--steps", "3"]) == 0
    assert capsys.readouterr().out.split() == [str(run / "samples" / "sample_step00000004_seed0_ddim3.png")]


def test_sample_errors(tmp_path, capsys):
    assert main(["sample", str(tmp_path)]) == 2
    assert "is not a diffscale run (no config.yaml)" in capsys.readouterr().err


def test_export_loads_in_diffusers_pipeline_and_samples(tmp_path):
    from diffusers import DDPMPipeline

    run = _trained(tmp_path)
    out = tmp_path / "pipe"
    assert main(["export", str(run), "--diffusers", str(out)]) == 0
    pipe = DDPMPipeline.from_pretrained(str(out))
    images = pipe(batch_size=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                  output_type="np").images
    assert images.shape == (2, 8, 8, 1)
    assert main(["export", str(run), "--diffusers", str(out)]) == 2  # refuses to overwrite
