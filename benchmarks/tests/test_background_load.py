"""The background compile beside chosen loads: dynamo's account read from the compile's log in
either of torch's layouts, and the loads' processes started and ended."""

from __future__ import annotations

from benchmarks.background_load import account, start_load


def test_the_phases_are_read_from_a_table_or_comma_separated_account(tmp_path):
    table = tmp_path / "table.log"
    table.write_text("the first step compiled and ran in 132.4 s; dynamo's account of it:\n"
                     "Function                                  Runtimes (s)\n"
                     "_compile.compile_inner                         51.5518\n"
                     "bytecode_tracing                                9.2104\n"
                     "CachingAutotuner.benchmark_all_configs         19.6623\n"
                     "compile_fx.<locals>.bw_compiler                41.7736\n")
    commas = tmp_path / "commas.log"
    commas.write_text("Function, Runtimes (s)\n_compile.compile_inner, 18.8436\n"
                      "compile_fx.<locals>.bw_compiler, 19.1818\n")
    assert account(table) == {"_compile.compile_inner": 51.5518, "CachingAutotuner.benchmark_all_configs": 19.6623,
                              "compile_fx.<locals>.bw_compiler": 41.7736}
    assert account(commas) == {"_compile.compile_inner": 18.8436, "compile_fx.<locals>.bw_compiler": 19.1818}


def test_the_cpu_load_spins_until_it_is_ended():
    assert start_load("none") == []
    (spinner,) = start_load("cpu")
    try:
        assert spinner.poll() is None
    finally:
        spinner.kill()
    assert spinner.wait(timeout=60) != 0
