# Tests of cf-lm (run by CTest: cmake -DAPP=... -DWORK_DIR=... -DMODE=smoke|errors -P this file).
#   errors: bad command lines and config files exit with status 2 naming the bad
#           option or key; a missing data folder exits with 1.
#   smoke:  a tiny config trains every model a few steps on fortunes and on the
#           retrieval task, writes every table cell and reuses its checkpoints;
#           exits with 77 (CTest: skipped) when the Debian package fortunes is missing.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

if(MODE STREQUAL "errors")
  check_option_errors(seq-len)
  run(2 out err --models sliding-window,reformer)
  expect_match("${err}" "--models: unknown model 'reformer'" "bad model")
  run(2 out err --window 16 --stride 16)
  expect_match("${err}" "--stride \\(16\\) must be less than --window \\(16\\)" "stride >= window")
  run(2 out err --cluster-layers 7)
  expect_match("${err}" "--cluster-layers: layer 7 out of range \\[0, 4\\)" "layer out of range")
  run(2 out err --models cluster-former --clusters 4,4)
  expect_match("${err}" "--clusters lists 4 twice" "repeated cluster count")
  run(2 out err --models cluster-former --clusters=)
  expect_match("${err}" "--clusters must list at least one cluster count" "no cluster count")
  run(2 out err --sparse-summary 5 --stride 4)
  expect_match("${err}" "--sparse-summary \\(5\\) must be at most the block of 4 tokens" "summary > block")
  run(2 out err --lm false --retrieval false)
  expect_match("${err}" "leave nothing to run" "nothing to run")
  run(2 out err --retrieval yes)
  expect_match("${err}" "--retrieval must be true or false, got 'yes'" "bad bool")
  run(2 out err --loss-form ball)
  expect_match("${err}" "--loss-form must be inner, cosine or sphere, got 'ball'" "bad loss form")
  run(2 out err --d-model 30)
  expect_match("${err}" "--d-model \\(30\\) must be divisible by --n-heads \\(4\\)" "heads")
  # Settings a model would refuse when built, after the models before it had trained: refused up front.
  # The retrieval task alone reads no fortunes: a missing --data-dir does not matter to it.
  run(0 out err --lm false --data-dir "${WORK_DIR}/no-such-dir" --models sliding-window --retrieval-steps 2
      --steps 2 --warmup 1 --retrieval-len 29)
  # A shorter sequence would put the key within the sliding windows' reach (21 positions).
  run(2 out err --retrieval-len 28)
  expect_match("${err}" "--retrieval-len must be at least 29, got 28" "retrieval key within reach")
  run(2 out err --checkpoint-every 1)
  expect_match("${err}" "--checkpoint-every needs --checkpoint-dir" "checkpoint-every without checkpoints")
  run(2 out err --lsh-buckets 3)
  expect_match("${err}" "--lsh-buckets must be 1 \\(no hashing\\) or even" "odd LSH buckets")
  run(2 out err --clusters 1000 --memory-size 64)
  expect_match("${err}" "--clusters: 1000 clusters exceed the memory bank of --memory-size 64" "clusters > memory")
  run(2 out err --models neural-clustering --k 5000 --seq-len 32)
  expect_match("${err}" "--k \\(5000 clusters\\) exceeds the sequence length N = 32" "k > N")
  file(WRITE "${WORK_DIR}/huge_int.json" "{\"seq_len\": 9223372036854775808}")
  run(2 out err --config huge_int.json)
  expect_match("${err}" "seq_len. is 9223372036854775808, beyond the int64 range" "an integer beyond int64")
  file(WRITE "${WORK_DIR}/bad_type.json" "{\"clusters\": 16}")
  run(2 out err --config bad_type.json)
  expect_match("${err}" "config key 'clusters' must be an array of integers" "mistyped config key")
  run(1 out err --data-dir "${WORK_DIR}/no-such-dir" --steps 2 --warmup 1)
  expect_match("${err}" "no-such-dir" "missing data folder named")
  return()
endif()

if(NOT MODE STREQUAL "smoke")
  message(FATAL_ERROR "MODE must be smoke or errors, got '${MODE}'")
endif()
if(NOT EXISTS /usr/share/games/fortunes/fortunes)
  message("fortunes is not installed (Debian package 'fortunes'): smoke test skipped")
  cmake_language(EXIT 77)
endif()

set(tiny --seq-len 32 --batch-size 4 --eval-windows 4 --n-layers 2 --d-model 16 --n-heads 2 --d-ff 32
    --window 8 --stride 4 --cluster-layers 1 --clusters 4 --memory-size 256 --update-every 2 --lsh-buckets 4
    --steps 4 --warmup 1 --eval-every 2 --log-every 2 --retrieval-len 32 --retrieval-steps 3 --seed 2
    --checkpoint-dir ckpt)
run(0 out err ${tiny})
last_line("${out}" summary)
foreach(m sliding-window sliding-window+lsh sliding-window+sparse cluster-former-4 neural-clustering)
  string(JSON b GET "${summary}" table ${m} test_bpc_mean)
  # An untrained character model is near log2(vocab) ~ 7 bits; a few steps must
  # give a finite value in a sane range.
  if(NOT b GREATER 0.5 OR NOT b LESS 9)
    message(FATAL_ERROR "smoke: ${m} test bpc ${b}")
  endif()
  string(JSON a GET "${summary}" retrieval ${m} accuracy_mean)
  if(a LESS 0 OR a GREATER 1)
    message(FATAL_ERROR "smoke: ${m} retrieval accuracy ${a}")
  endif()
  if(NOT EXISTS "${WORK_DIR}/ckpt/${m}-seed2.safetensors")
    message(FATAL_ERROR "smoke: checkpoint ${m}-seed2.safetensors not written")
  endif()
endforeach()
expect_match("${out}" "\"event\":\"val\",\"seed\":2,\"model\":\"cluster-former-4\",\"step\":2,\"val_bpc\":" "val lines")
expect_match("${err}" "\\| sliding-window\\+lsh \\|" "Markdown table")

run(0 out2 err2 ${tiny} --retrieval false)
last_line("${out2}" summary2)
if(out2 MATCHES "\"event\":\"train\"")
  message(FATAL_ERROR "smoke: a finished checkpoint was trained again:\n${out2}")
endif()
expect_same_json("${summary}" "${summary2}" "reloaded vs trained" table cluster-former-4 test_bpc_mean)
# A model reused from its checkpoint measured no training: null in the summary, "–" in the table (it was 0.0).
expect_match("${summary2}" "\"train_s_mean\":null,\"train_peak_mib_mean\":null" "reused models' training figures")
expect_match("${err2}" "\\| cluster-former-4 \\| [0-9.]+ \\| [0-9.]+ \\| – \\| – \\|" "reused models' table row")
# --stop-after: each run ends after 2 steps of the model it is training (exit 3,
# checkpoint written); rerunning the same command continues. Five models of 4
# steps take six runs, and every model ends with the uninterrupted run's bits.
# (The retrieval models keep no checkpoint: they train whole in the last run.)
set(stopping ${tiny} --checkpoint-dir ckpt-stop --stop-after 2)
foreach(i RANGE 1 5)
  run(3 out_s err_s ${stopping})
  expect_match("${err_s}" "stopped after 2 steps as --stop-after asked: 'ckpt-stop/[a-z+-]+4?-seed2.safetensors' holds step 2 of 4; run the same command again to continue" "stop message ${i}")
  expect_match("${out_s}" "\"event\":\"stopped\",\"seed\":2,\"model\":\"[a-z+-]+4?\",\"step\":2" "stopped line ${i}")
  if(i GREATER 1)
    expect_match("${out_s}" "\"event\":\"resume\",\"seed\":2,\"model\":\"[a-z+-]+4?\",\"checkpoint\":\"[^\"]+\",\"step\":2" "resume line ${i}")
  endif()
endforeach()
run(0 out_s err_s ${stopping})
last_line("${out_s}" summary_s)
foreach(m sliding-window sliding-window+lsh sliding-window+sparse cluster-former-4 neural-clustering)
  expect_same_json("${summary}" "${summary_s}" "trained in runs of 2 steps vs one run" table ${m} test_bpc_mean)
  expect_same_json("${summary}" "${summary_s}" "retrieval after runs of 2 steps vs one run" retrieval ${m} accuracy_mean)
endforeach()
run(2 out err --stop-after 2)
expect_match("${err}" "--stop-after needs --checkpoint-dir" "stop-after without checkpoints")

run(1 out err ${tiny} --update-every 3)
expect_match("${err}" "checkpoint 'ckpt/cluster-former-4-seed2.safetensors' was written with other settings" "stale checkpoint")

# --loss-form: the bounded L1/L2 forms train a model of their own name (its
# checkpoint apart from the paper's inner-product model), with other bits.
run(0 out_c err_c ${tiny} --models neural-clustering --loss-form cosine --retrieval false)
last_line("${out_c}" summary_c)
string(JSON bc GET "${summary_c}" table neural-clustering-cosine test_bpc_mean)
string(JSON bi GET "${summary}" table neural-clustering test_bpc_mean)
if(NOT bc GREATER 0.5 OR NOT bc LESS 9 OR bc STREQUAL bi)
  message(FATAL_ERROR "smoke: neural-clustering-cosine test bpc ${bc} (inner form: ${bi})")
endif()
if(NOT EXISTS "${WORK_DIR}/ckpt/neural-clustering-cosine-seed2.safetensors")
  message(FATAL_ERROR "smoke: checkpoint neural-clustering-cosine-seed2.safetensors not written")
endif()
# The other options of RESULTS.md's 10,000-step table: the sphere form, no clustering losses
# (--mu 0 --nu 0), the sparse row's block size, checkpoints every N steps; the first three change the bits.
run(0 out_m err_m ${tiny} --models neural-clustering,sliding-window+sparse --loss-form sphere --sparse-block 8
    --checkpoint-every 2 --retrieval false --checkpoint-dir ckpt-more)
last_line("${out_m}" summary_m)
string(JSON bs GET "${summary_m}" table neural-clustering-sphere test_bpc_mean)
string(JSON bp GET "${summary_m}" table sliding-window+sparse test_bpc_mean)
string(JSON bp0 GET "${summary}" table sliding-window+sparse test_bpc_mean)
if(NOT bs GREATER 0.5 OR NOT bs LESS 9 OR bs STREQUAL bi OR bs STREQUAL bc OR bp STREQUAL bp0)
  message(FATAL_ERROR "smoke: sphere ${bs} (inner ${bi}, cosine ${bc}); sparse with blocks of 8 ${bp} (of 4: ${bp0})")
endif()
# (what --checkpoint-every writes mid-run is tested in tests/apps/test_train_run.cpp)
run(0 out_z err_z ${tiny} --models neural-clustering --mu 0 --nu 0 --retrieval false --checkpoint-dir ckpt-noloss)
last_line("${out_z}" summary_z)
string(JSON bz GET "${summary_z}" table neural-clustering test_bpc_mean)
if(NOT bz GREATER 0.5 OR NOT bz LESS 9 OR bz STREQUAL bi)
  message(FATAL_ERROR "smoke: neural-clustering without L1/L2 test bpc ${bz} (with them: ${bi})")
endif()
