"""Bad arguments and environments of the `ternary` commands: one message and exit 2 (with
--json, a JSON error object), never a traceback. None of these starts vLLM."""

from __future__ import annotations

import json

import pytest

from ternary.cli import main
from ternary.formats import testing as T


def _usage_error(argv, capsys, words):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_make_tiny_argument_refusals(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _usage_error(["make-tiny", ""], capsys, "an empty path would write into the current directory")
    assert not list(tmp_path.iterdir())
    for seed in ("-1", str(2**64)):
        _usage_error(["make-tiny", "m", "--seed", seed], capsys, "is not in 0 .. 2**63 - 1")
    (tmp_path / "afile").write_text("x")
    assert main(["make-tiny", str(tmp_path / "afile" / "m")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_make_tiny_refuses_a_directory_holding_another_models_weights(tmp_path, capsys):
    d = T.write_canonical(tmp_path / "m", max_shard_bytes=4000)  # sharded, with an index
    before = sorted(p.name for p in d.iterdir())
    assert main(["make-tiny", str(d)]) == 2
    assert "holds another model's weights (model-00001-of-" in capsys.readouterr().err
    assert sorted(p.name for p in d.iterdir()) == before  # nothing deleted or added


@pytest.mark.parametrize("writer,words", [
    (T.write_dense, "no quantization_config: a dense model has nothing ternary to validate"),
    (T.write_vendor_int8, "vendor-int8 checkpoint, which vLLM does not read: `ternary convert`"),
])
def test_validate_refuses_before_starting_vllm(tmp_path, capsys, writer, words):
    d = writer(tmp_path / "m")
    assert main(["validate", str(d), "--json"]) == 2
    out = capsys.readouterr()
    assert words in out.err and json.loads(out.out) == {"ok": False, "error": out.err.split(
        "ternary validate: ", 1)[1].strip()}


@pytest.mark.parametrize("flag", ["--max-tokens", "--tp"])
def test_validate_sizes_must_be_positive(tmp_path, capsys, flag):
    _usage_error(["validate", str(tmp_path), flag, "0"], capsys, "0 is not a positive integer")


def test_validate_context_length_stays_within_the_model():
    from ternary.tools.validate import context_length

    class Tok:
        def __call__(self, text):
            return type("Ids", (), {"input_ids": text.split()})()

    prompts = ["a b c", "a b c d e"]
    assert context_length({"max_position_embeddings": 4096}, Tok(), prompts, 16) == 256
    assert context_length({"max_position_embeddings": 4096}, Tok(), prompts, 300) == 305
    assert context_length({"max_position_embeddings": 128}, Tok(), prompts, 16) == 128
    with pytest.raises(ValueError, match="is 305 tokens, past the model's "
                                         "max_position_embeddings=128; lower --max-tokens"):
        context_length({"max_position_embeddings": 128}, Tok(), prompts, 300)


@pytest.mark.parametrize("content,words", [
    (None, "(from TERNARY_TARGETS_TOML): cannot read the target matrix"),
    ("[targets\n", "not valid TOML"),
    ("[cuda]\n", "no [targets] table"),
])
def test_targets_names_a_matrix_it_cannot_read(tmp_path, capsys, monkeypatch, content, words):
    path = tmp_path / "targets.toml"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("TERNARY_TARGETS_TOML", str(path))
    assert main(["targets", "--json"]) == 2
    out = capsys.readouterr()
    assert words in out.err and words in json.loads(out.out)["error"]


def test_convert_cannot_write_its_destination(tmp_path, capsys):
    src = T.write_bitnet(tmp_path / "b")
    (tmp_path / "afile").write_text("x")
    assert main(["convert", str(src), str(tmp_path / "afile" / "out"), "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["ok"] is False and "cannot write the converted model" in out.err


def test_bench_serve_checks_its_json_path_before_running(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["bench-serve", "--prepare-only", "--shape", "tiny", "--work",
                 str(tmp_path / "w"), "--json", str(tmp_path / "afile" / "r.json")]) == 2
    assert "--json" in capsys.readouterr().err and not (tmp_path / "w").exists()


def test_serve_without_a_working_vllm(monkeypatch, capsys):
    import ternary.vllm.register as reg

    monkeypatch.setenv("TERNARY_SERVE_CHILD", "1")  # the supervised child's check, in-process
    def broken():
        raise ImportError("No module named 'vllm.model_executor'")

    monkeypatch.setattr(reg, "register", broken)
    assert main(["serve", "some-model"]) == 2
    assert "vLLM is not importable (No module named 'vllm.model_executor')" in \
        capsys.readouterr().err


def test_serve_with_an_unsupported_vllm(monkeypatch, capsys):
    import ternary.vllm.register as reg

    monkeypatch.setenv("TERNARY_SERVE_CHILD", "1")  # the supervised child's check, in-process
    def unsupported():
        raise RuntimeError("vLLM 0.5.0: QUANTIZATION_METHODS is a list and there is no "
                           "register_quantization_config; this vLLM is not supported")

    monkeypatch.setattr(reg, "register", unsupported)
    assert main(["serve", "some-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ternary serve: vLLM 0.5.0:") and "is not supported" in err


@pytest.mark.parametrize("args, tp", [
    ([], 1), (["--port", "8000"], 1), (["--tensor-parallel-size", "2"], 2),
    (["--dtype", "bfloat16", "--tensor-parallel-size=4"], 4), (["-tp", "2"], 2),
    (["--tensor-parallel-size", "x"], 1), (["--tensor-parallel-size"], 1),
    (["--tensor_parallel_size", "3"], 3), (["-tp", "2", "--tensor-parallel-size", "4"], 4),
])
def test_serve_reads_the_tensor_parallel_size(args, tp):
    from ternary.commands.serve import tensor_parallel

    assert tensor_parallel(args) == tp


def test_convert_blames_a_source_file_it_cannot_read_on_the_source(tmp_path, capsys):
    # a copied Hugging Face cache whose tokenizer link points at a blob that is not there
    src = T.write_bitnet(tmp_path / "b")
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(tmp_path / "blobs" / "gone")
    assert main(["convert", str(src), str(tmp_path / "out"), "--json"]) == 2
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert error.startswith(f"{src / 'tokenizer.json'}: cannot read it"), error
    assert "check the source model's files" in error and not (tmp_path / "out").exists()
