"""The `outcore` command: ingest, info, verify and the rest, errors in one line with exit status 2, spoken in
flag names."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

import outcore
from outcore import seeds
from outcore.cli import main
from outcore.imaging import native
from outcore.storage import chunk_reads
from outcore.testing import corrupt_chunk, delete_shard, make_store


def test_ingest_folder_then_info_and_verify(image_folder, tmp_path, capsys):
    assert main(["ingest", str(image_folder), str(tmp_path / "t.zarr"), "--shape", "32x32x3", "--no-progress"]) == 0
    assert len(outcore.open_dataset(tmp_path / "t.zarr")) == 20
    capsys.readouterr()
    assert main(["info", str(tmp_path / "t.zarr")]) == 0
    info = capsys.readouterr().out
    for expected in ("20 samples", "images", "20x32x32x3", "blosc(lz4:5:shuffle)+crc32c", "on disk", "ratio",
                     "classes of 'labels' (3): cat, dog, owl", "provenance"):
        assert expected in info
    assert main(["verify", str(tmp_path / "t.zarr"), "--no-progress"]) == 0
    assert "OK" in capsys.readouterr().out


def test_ingest_csv_with_label_columns(image_folder, tmp_path):
    names = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))
    csv = image_folder / "labels.csv"
    pd.DataFrame({"path": names, "bi": [i % 2 for i in range(20)], "multi": [n[:3] for n in names]}).to_csv(
        csv, index=False)
    code = main(["ingest", str(csv), str(tmp_path / "c.zarr.zip"), "--path-column", "path", "--label-columns",
                 "bi,multi", "--shape", "24x24x3", "--compression", "zstd:3", "--no-shuffle", "--no-progress"])
    assert code == 0
    ds = outcore.open_dataset(tmp_path / "c.zarr.zip")
    assert ds.fields == ("images", "bi", "multi", "path", "source_index", "file_stat", "file_digest") and ds["images"].shape == (20, 24, 24, 3)
    assert ds["bi"].compute().tolist() == [i % 2 for i in range(20)]


def test_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
    assert main(["ingest", str(tmp_path / "missing"), str(tmp_path / "x.zarr"), "--shape", "8x8x3"]) == 2
    assert "outcore ingest: error: image folder" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "x.zarr")]) == 2
    capsys.readouterr()
    assert main(["info"]) == 2
    assert capsys.readouterr().err.strip() == "outcore info: error: outcore info needs a STORE to describe, or --system"


def test_a_ctrl_c_line_says_outcores_notes_and_not_pythons(monkeypatch, capsys):
    """A Ctrl-C taken while a class is made (an enum's, as a module imports) carries Python's note "Error calling
    __set_name__ ..." (3.12 on): the one line says outcore's notes only."""
    def interrupted(args):
        interrupt = KeyboardInterrupt()
        interrupt.add_note("Error calling __set_name__ on '_proto_member' instance 'JANUARY' in 'Month'")
        interrupt.add_note("outcore could not stop the ingest's tasks (RuntimeError: gone); those started may still run")
        raise interrupt

    monkeypatch.setattr(sys.modules["outcore.cli.main"], "_info", interrupted)  # the module: `main` is its function
    assert main(["info", "x.zarr"]) == 130
    assert capsys.readouterr().err == ("outcore info: interrupted; outcore could not stop the ingest's tasks "
                                       "(RuntimeError: gone); those started may still run\n")


def test_info_system_names_the_jpeg_decoder_the_chunk_reads_and_the_draws(capsys):
    assert main(["info", "--system"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"JPEG boxes: {native.backend()}" in lines and f"chunk reads: {chunk_reads.how()}" in lines
    assert f"random draws: {seeds.how()}" in lines


@pytest.mark.parametrize(("arguments", "expected"), [
    (["--shape", "128;128"], "error: --shape 128;128 is not of the form HxW or HxWxC"),
    (["--shape", "128x128x2"], "error: --shape 128x128x2 has 2 channels"),
    (["--shape", "16x16x3", "--compression", "zstd:12"], "compression level 12 is not between 0 and 9"),
    (["--shape", "16x16x3", "--resize", "none"], ("pass --resize crop (or --resize fit, --resize pad) to convert "
                                                  "other sizes. Fix or remove the file, or pass --on-error skip")),
    (["--shape", "16x16x3", "--resize", "none", "--on-error", "skip"], "all 20 samples failed to load; the first: "),
    ([], "error: the following arguments are required: --shape (see outcore ingest --help)"),
    (["--shape", "8x8", "--chunk-size", "many"], "argument --chunk-size: invalid int value: 'many'"),
])
def test_cli_errors_speak_in_flag_names_on_one_line(image_folder, tmp_path, capsys, arguments, expected):
    assert _status(["ingest", str(image_folder), str(tmp_path / "x.zarr"), "--no-progress", *arguments]) == 2
    error = capsys.readouterr().err
    assert expected in error and error.count("\n") == 1 and "=" not in error.replace("--", ""), error


def test_cli_suggests_commands_not_python_calls(tmp_path, capsys):
    from outcore.testing import write_image_folder

    for split in ("train", "val"):
        write_image_folder(tmp_path / "photos" / split, 2, classes=("cat", "dog"), size=(8, 8))
    assert _status(["ingest", str(tmp_path / "photos"), str(tmp_path / "x.zarr"), "--shape", "8x8"]) == 2
    error = capsys.readouterr().err
    assert f"or all at once with outcore ingest {tmp_path / 'photos'} STORE --split folders;" in error, error
    assert "ingest_splits" not in error and error.count("\n") == 1


def test_a_bad_csv_and_a_decompression_bomb_are_one_plain_line(image_folder, tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("path,label\na.jpg,1\nb.jpg,2,3,4\n")
    assert _status(["ingest", str(csv), str(tmp_path / "c.zarr"), "--shape", "8x8x3", "--path-column", "path",
                    "--label-columns", "label"]) == 2
    error = capsys.readouterr().err
    assert "Expected 2 fields in line 3, saw 4); fix the file" in error and error.count("\n") == 1
    assert _status(["ingest", str(image_folder), str(tmp_path / "b.zarr"), "--shape", "8x8x3", "--max-pixels", "100",
                    "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "more than the limit of 100 (a decompression bomb, or a picture to shrink first; a larger --max-pixels N " \
           "admits it)" in error and error.count("--max-pixels") == 1 and error.count("\n") == 1


def _status(argv: list[str]) -> int:
    """The exit status of ``outcore ARGV``, whether argparse exits or `main` returns."""
    try:
        return main(argv)
    except SystemExit as exited:
        return exited.code


def test_cli_version_and_help_speak_plainly(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"outcore {outcore.__version__}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "``" not in capsys.readouterr().out


def test_an_unreachable_scheduler_is_one_line_after_the_timeout(image_folder, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    assert main(["ingest", str(image_folder), str(tmp_path / "x.zarr"), "--shape", "8x8", "--no-progress",
                 "--scheduler", address, "--scheduler-timeout", "1"]) == 2
    assert time.monotonic() - started < 15
    error = capsys.readouterr().err
    assert error.startswith(f"outcore ingest: error: no Dask scheduler answered at {address} within 1 s")
    assert error.count("\n") == 1 and not (tmp_path / "x.zarr").exists()


def test_a_closed_pipe_ends_quietly(tmp_path):
    store = make_store(tmp_path).location
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `outcore info STORE | head` once head has exited
    result = subprocess.run([sys.executable, "-m", "outcore.cli", "info", str(store)], stdout=write_end,
                            stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_verify_fails_on_a_corrupt_store(image_folder, tmp_path, capsys):
    main(["ingest", str(image_folder), str(tmp_path / "t.zarr"), "--shape", "32x32x3", "--no-progress"])
    corrupt_chunk(tmp_path / "t.zarr", "images", 0)
    assert main(["verify", str(tmp_path / "t.zarr"), "--no-progress"]) == 1
    assert "field 'images', chunk 0" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_trains_on_real_photographs_and_keeps_what_it_says(tmp_path):
    began, lines = time.time(), []
    with (tmp_path / "stderr").open("w") as errors, subprocess.Popen(
            [sys.executable, "-m", "outcore.cli", "demo", "--per-class", "60", "--size", "48", "--epochs", "3",
             "--no-progress"], stdout=subprocess.PIPE, stderr=errors, text=True, cwd=tmp_path) as demo:
        for line in demo.stdout:  # when it says how long it took: TensorFlow's exit, seconds long, comes after
            lines.append(line)
            if "demo took " in line:
                took = time.time() - began
        assert demo.wait(timeout=220) == 0, (tmp_path / "stderr").read_text()
    stdout, stderr = "".join(lines), (tmp_path / "stderr").read_text()
    said = float(stdout.split("demo took ")[1].split(" s")[0])
    # the whole command's time, not the part after imports (seconds of them): rounded to a second, from the process's
    # start as psutil counts it, clock ticks after a boot time in whole seconds (up to a second early)
    assert took - 1.5 <= said <= took + 1.5, (said, took)
    assert stderr == ""  # neither TensorFlow's start-up lines nor anything else
    workdir = tmp_path / "outcore-demo"  # the default, kept after the demo
    assert f"everything goes to {workdir}" in stdout and "chunks checked, OK" in stdout
    assert "classes of 'labels' (6): astronaut, cat, china, coffee, flower, rocket" in stdout
    assert "photographs' pixels barely compress without loss" in stdout
    assert "waited for data" in stdout and "label TV distance per batch" in stdout
    accuracy = float(stdout.split("test accuracy: ")[1].split("%")[0])
    assert accuracy > 50  # six classes: chance is 16.7 %
    predictions = outcore.open_dataset(workdir / "test-predictions.zarr")
    test = outcore.open_dataset(workdir / "test.zarr.zip")
    assert len(predictions) == len(test) == 6 * 15
    measured = (predictions["predicted"].compute() == test["labels"].compute()).mean() * 100
    assert abs(measured - accuracy) < 0.1  # the stored predictions line up with the test store's labels
    assert "outcore ingest my_photos/train train.zarr --shape 48x48x3" in stdout


def test_info_and_verify_on_a_store_with_a_missing_shard(tmp_path, capsys):
    ds = make_store(tmp_path, chunk_size=8)
    key = delete_shard(ds.location, "images", 1)
    assert main(["info", ds.location]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "outcore verify" in err
    assert main(["verify", ds.location, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "4 problem(s)" in out and out.count("its shard file is missing") == 4  # its four chunks


def test_verify_lists_damaged_metadata_as_a_problem(tmp_path, capsys):
    ds = make_store(tmp_path)
    (tmp_path / "s.zarr" / "labels" / "zarr.json").write_text("{not json")
    assert main(["verify", ds.location, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "1 problem(s)" in out and "its metadata cannot be read" in out
    assert main(["verify", str(tmp_path / "nowhere.zarr")]) == 2  # no store at all: a usage error


def test_ingest_recognises_coco_files_and_reads_mask_columns(tmp_path, capsys):
    import json

    import numpy as np
    from PIL import Image

    for number in range(3):
        Image.fromarray(np.full((20, 30, 3), 60 * number, np.uint8)).save(tmp_path / f"{number}.png")
        Image.fromarray(np.full((20, 30), number, np.uint8), mode="L").save(tmp_path / f"{number}-mask.png")
    coco = {"images": [{"id": n, "file_name": f"{n}.png", "height": 20, "width": 30} for n in range(3)],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 5, "bbox": [2, 3, 10, 8], "iscrowd": 0,
                             "segmentation": [[2, 3, 12, 3, 12, 11]]}],
            "categories": [{"id": 5, "name": "kite"}]}
    (tmp_path / "instances.json").write_text(json.dumps(coco))
    assert main(["ingest", str(tmp_path / "instances.json"), str(tmp_path / "c.zarr"), "--shape", "20x30x3",
                 "--no-progress"]) == 0
    ds = outcore.open_dataset(tmp_path / "c.zarr")
    assert ds.classes == ["kite"] and {"boxes", "labels", "iscrowd", "masks"} <= set(ds.fields)
    assert main(["ingest", str(tmp_path / "instances.json"), str(tmp_path / "d.zarr"), "--shape", "20x30x3",
                 "--no-masks", "--no-progress"]) == 0
    assert "masks" not in outcore.open_dataset(tmp_path / "d.zarr").fields
    assert main(["ingest", str(tmp_path / "instances.json"), str(tmp_path / "own.zarr"), "--shape", "any",
                 "--no-progress"]) == 0  # the maps at their pictures' own size, cut with them by bench's crop
    capsys.readouterr()
    assert main(["info", str(tmp_path / "own.zarr")]) == 0
    assert re.search(r"masks +uint16 \(own sizes\) +3x20x30 ", capsys.readouterr().out)
    assert main(["bench", str(tmp_path / "own.zarr"), "--batch-size", "2", "--repeats", "1", "--crop", "16"]) == 0
    assert "crop 16 + flip" in capsys.readouterr().out
    pd.DataFrame({"path": [f"{n}.png" for n in range(3)], "mask": [f"{n}-mask.png" for n in range(3)]}).to_csv(
        tmp_path / "masks.csv", index=False)
    assert main(["ingest", str(tmp_path / "masks.csv"), str(tmp_path / "m.zarr"), "--shape", "10x15x3",
                 "--mask-columns", "mask", "--resize", "fit", "--no-shuffle", "--no-progress"]) == 0
    assert outcore.open_dataset(tmp_path / "m.zarr")["mask"].compute()[:, 0, 0].tolist() == [0, 1, 2]
    capsys.readouterr()
    folder = tmp_path / "folder" / "a"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "x.png")
    assert main(["ingest", str(tmp_path / "folder"), str(tmp_path / "f.zarr"), "--shape", "8x8x3", "--masks"]) == 2
    said = capsys.readouterr().err.strip()
    assert "--masks" in said and len(said.splitlines()) == 1
