# Tests of cf-approx (run by CTest: cmake -DAPP=... -DWORK_DIR=... -DMODE=smoke|errors -P this file).
#   errors: bad command lines and config files exit with status 2 and a message
#           naming the bad option or key; a missing data folder exits with 1.
#   smoke:  a tiny config (two topics, a few steps, one seed) on the fortunes corpus
#           writes every table cell and the summary, checks a checkpoint is reused;
#           exits with 77 (CTest: skipped) when the Debian package fortunes is missing.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

if(MODE STREQUAL "errors")
  check_option_errors(steps)

  run(2 out err --clusters 0)
  expect_match("${err}" "--clusters must be at least 1, got 0" "clusters = 0")
  run(2 out err --train full,bigbird)
  expect_match("${err}" "--train: unknown attention 'bigbird'" "bad train attention")
  run(2 out err --train lsh-0)
  expect_match("${err}" "--train: unknown attention 'lsh-0' \\(expected full, shared-full, shared-full-plain, clustered, improved-clustered or lsh-R with R >= 1 rounds\\)" "lsh without rounds")
  run(2 out err --train lsh-01)
  expect_match("${err}" "--train: unknown attention 'lsh-01'" "lsh rounds with a leading zero")
  run(2 out err --lsh-rounds 1,0)
  expect_match("${err}" "--lsh-rounds" "lsh rounds 0")
  run(2 out err --lsh-bucket-size 0)
  expect_match("${err}" "--lsh-bucket-size must be at least 1, got 0" "lsh bucket 0")
  run(2 out err --d-model 30 --n-heads 4)
  expect_match("${err}" "--d-model \\(30\\) must be divisible by --n-heads \\(4\\)" "heads")
  run(2 out err --seed 1 --seeds 1,2)
  expect_match("${err}" "give --seed or --seeds, not both" "seed and seeds")
  # cluster counts beyond the positions a model reads: refused when given (the row named a count that
  # ran as N), trimmed when defaults
  run(2 out err --max-len 32 --eval-clusters 8,40)
  expect_match("${err}" "--eval-clusters 40 is more than the 33 positions a model reads \\(--max-len 32 and <cls>\\)" "eval clusters beyond N")
  run(2 out err --max-len 8)  # the default --clusters 16 of the trained clustered models
  expect_match("${err}" "--clusters 16 is more than the 9 positions a model reads \\(--max-len 8 and <cls>\\)" "clusters beyond N")
  run(2 out err --task masked --seq-len 40 --sweep-clusters 64)
  expect_match("${err}" "--sweep-clusters 64 is more than the 40 positions a model reads \\(--seq-len 40\\)" "sweep beyond N")
  run(2 out err --pooling max)
  expect_match("${err}" "--pooling must be mean or first, got 'max'" "bad pooling")
  run(2 out err --task tagging)
  expect_match("${err}" "--task must be topic or masked, got 'tagging'" "bad task")
  run(2 out err --task masked --mask-rate 1)
  expect_match("${err}" "--mask-rate must be in \\(0, 1\\), got 1" "mask rate 1")
  run(2 out err --task masked --seq-len 1)
  expect_match("${err}" "--seq-len must be at least 2, got 1" "seq-len 1")
  run(2 out err --oracle-top maybe)
  expect_match("${err}" "--oracle-top must be true or false, got 'maybe'" "bad bool")
  # A device no machine has (a GPU machine accepts plain 'cuda' and would train).
  run(2 out err --device cuda:99)
  expect_match("${err}" "device 'cuda:99' is not available" "missing CUDA device refused")

  file(WRITE "${WORK_DIR}/bad_type.json" "{\"lr\": \"fast\"}")
  run(2 out err --config bad_type.json)
  expect_match("${err}" "config key 'lr' must be a number" "mistyped config key")
  file(WRITE "${WORK_DIR}/bad_list.json" "{\"seeds\": [0, \"one\"]}")
  run(2 out err --config bad_list.json)
  expect_match("${err}" "config key 'seeds' must be an array of integers" "mistyped list")

  run(2 out err --steps 10 --warmup 10)
  expect_match("${err}" "--warmup \\(10\\) must be less than --steps \\(10\\)" "warmup >= steps")
  run(1 out err --data-dir "${WORK_DIR}/no-such-dir" --steps 2 --warmup 1)
  expect_match("${err}" "no-such-dir" "missing data folder named")
  return()
endif()

if(NOT MODE STREQUAL "smoke")
  message(FATAL_ERROR "MODE must be smoke or errors, got '${MODE}'")
endif()

if(NOT EXISTS /usr/share/games/fortunes/fortunes)
  message("fortunes is not installed (Debian package 'fortunes'): smoke test skipped")
  cmake_language(EXIT 77)  # CTest's SKIP_RETURN_CODE
endif()

# Two topics of at least 600 texts, 40 texts each, a 2-layer d=16 model, 6 steps.
set(tiny --min-texts 600 --max-per-class 40 --max-len 96 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --steps 6 --batch-size 8 --warmup 2 --eval-every 3 --log-every 3 --clusters 4 --topk 8 --iterations 2
    --sweep-clusters 2,8 --seed 3 --checkpoint-dir ckpt)
run(0 out err ${tiny})
last_line("${out}" summary)
string(JSON classes GET "${summary}" classes)
if(classes LESS 2)
  message(FATAL_ERROR "smoke: fewer than 2 classes: ${summary}")
endif()
# Every (train, eval) cell is present and is an accuracy in [0, 1].
foreach(train full clustered-4 i-clustered-4)
  foreach(eval full clustered-4 clustered-8 i-clustered-4 i-clustered-8 oracle-top)
    string(JSON a GET "${summary}" table ${train} ${eval} accuracy_mean)
    if(a LESS 0 OR a GREATER 1)
      message(FATAL_ERROR "smoke: accuracy ${train}/${eval} = ${a}")
    endif()
  endforeach()
  # The attention a model was trained with reproduces its own predictions exactly
  # (same hashing seed in every evaluation).
  set(native ${train})
  string(JSON g GET "${summary}" table ${train} ${native} agreement_mean)
  if(NOT g EQUAL 1)
    message(FATAL_ERROR "smoke: ${train} evaluated with itself agrees on ${g} of the texts, not 1")
  endif()
  foreach(variant clustered i-clustered)
    foreach(c 2 8)
      string(JSON t GET "${summary}" sweep ${train} ${variant} ${c} time_s_mean)
    endforeach()
  endforeach()
endforeach()
expect_match("${out}" "\"event\":\"train\",\"seed\":3,\"train_attention\":\"i-clustered-4\",\"step\":3," "train lines")
expect_match("${out}" "\"event\":\"val\",\"seed\":3,\"train_attention\":\"full\",\"step\":6," "val lines")
expect_match("${err}" "\\| evaluate with \\| full \\| clustered-4 \\| i-clustered-4 \\|" "Markdown table")
foreach(f full-C4-seed3 clustered-C4-seed3 improved-clustered-C4-seed3)
  if(NOT EXISTS "${WORK_DIR}/ckpt/${f}.safetensors")
    message(FATAL_ERROR "smoke: checkpoint ${f}.safetensors not written")
  endif()
endforeach()

# The second run reuses the finished checkpoints: no training, the same test accuracies.
run(0 out2 err2 ${tiny})
last_line("${out2}" summary2)
expect_match("${out2}" "\"event\":\"resume\",\"seed\":3,\"train_attention\":\"full\"" "resume line")
if(out2 MATCHES "\"event\":\"train\"")
  message(FATAL_ERROR "smoke: a finished checkpoint was trained again:\n${out2}")
endif()
expect_same_json("${summary}" "${summary2}" "reloaded vs trained" table full full accuracy_mean)
# A checkpoint written with other settings is refused, naming the file.
run(1 out err ${tiny} --lr 0.01)
expect_match("${err}" "checkpoint 'ckpt/full-C4-seed3.safetensors' was written with other settings" "stale checkpoint")

# Every cell of a summary's table is an accuracy in [0, 1], every trained model agrees with
# itself on every one of its `units` (texts, characters), and each model's checkpoint is
# written in `dir`.
function(check_summary summary trains evals dir checkpoints units)
  foreach(train ${trains})
    foreach(eval ${evals})
      string(JSON a GET "${summary}" table ${train} ${eval} accuracy_mean)
      if(a LESS 0 OR a GREATER 1)
        message(FATAL_ERROR "smoke: accuracy ${train}/${eval} = ${a}")
      endif()
    endforeach()
    string(JSON g GET "${summary}" table ${train} ${train} agreement_mean)
    if(NOT g EQUAL 1)
      message(FATAL_ERROR "smoke: ${train} evaluated with itself agrees on ${g} of the ${units}, not 1")
    endif()
  endforeach()
  foreach(f ${checkpoints})
    if(NOT EXISTS "${WORK_DIR}/${dir}/${f}.safetensors")
      message(FATAL_ERROR "smoke: checkpoint ${dir}/${f}.safetensors not written")
    endif()
  endforeach()
endfunction()

# The Reformer columns: shared-full, shared-full-plain (no key projection) and lsh-2 models run every
# attention that shares queries and keys, and clustered, improved clustered and oracle-top with the keys
# taken from the queries, under the Reformer's key rule for shared-full and lsh-R and as they are for
# shared-full-plain; a model with a key projection gets no sharing cell and the reverse ("-" in the tables).
# A trained lsh-R has its own row even when R is not among --lsh-rounds (lsh-2 here).
run(0 out err ${tiny} --train full,shared-full,shared-full-plain,lsh-2 --lsh-rounds 1 --lsh-bucket-size 8
    --checkpoint-dir ckpt-shared)
last_line("${out}" summary)
check_summary("${summary}" "shared-full;shared-full-plain;lsh-2"
              "shared-full;shared-full-plain;lsh-1;lsh-2;clustered-4;clustered-8;i-clustered-4;i-clustered-8;oracle-top"
              ckpt-shared "shared-full-C4-seed3;shared-full-plain-C4-seed3;lsh-2-C4-bucket8-seed3" texts)
foreach(train shared-full shared-full-plain lsh-2)
  string(JSON none ERROR_VARIABLE missing GET "${summary}" table ${train} full)
  if(NOT missing)
    message(FATAL_ERROR "smoke: ${train} (no key projection) has a full-attention cell: ${none}")
  endif()
endforeach()
string(JSON none ERROR_VARIABLE missing GET "${summary}" table full lsh-1)
if(NOT missing)
  message(FATAL_ERROR "smoke: the full model (a key projection) has an lsh-1 cell: ${none}")
endif()
expect_match("${err}" "\\| lsh-1 \\| - \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\|" "dash for a cell the model cannot run")
# The key rule each evaluation used, in the eval and sweep events.
foreach(rule "full,clustered-4,projection" "shared-full,clustered-4,reformer" "lsh-2,oracle-top,reformer"
        "shared-full-plain,i-clustered-8,plain" "shared-full-plain,oracle-top,plain"
        "shared-full-plain,shared-full,reformer")
  string(REPLACE "," ";" r "${rule}")
  list(GET r 0 t)
  list(GET r 1 e)
  list(GET r 2 k)
  expect_match("${out}" "\"train_attention\":\"${t}\",\"eval_attention\":\"${e}\",[^}]*\"key_rule\":\"${k}\"" "key rule ${rule}")
endforeach()
expect_match("${out}" "\"event\":\"sweep\",\"seed\":3,\"train_attention\":\"lsh-2\",[^}]*\"key_rule\":\"reformer\"" "sweep key rule")
# Another LSH chunk length is another model: trained into its own file, not refused as a stale one.
run(0 out err ${tiny} --train lsh-2 --lsh-rounds 2 --lsh-bucket-size 4 --checkpoint-dir ckpt-shared)
expect_match("${out}" "\"event\":\"train\",\"seed\":3,\"train_attention\":\"lsh-2\"" "lsh-2 with chunks of 4 trained")
if(NOT EXISTS "${WORK_DIR}/ckpt-shared/lsh-2-C4-bucket4-seed3.safetensors")
  message(FATAL_ERROR "smoke: checkpoint lsh-2-C4-bucket4-seed3.safetensors not written")
endif()

# --task masked: per-token evaluation of a masked-character model. Every cell is
# a token accuracy over the same hidden characters; a model agrees with itself.
set(masked --task masked --min-texts 600 --max-per-class 40 --max-len 400 --seq-len 48 --eval-windows 6
    --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32 --steps 6 --batch-size 4 --warmup 2 --eval-every 3
    --log-every 3 --clusters 4 --topk 8 --iterations 2 --sweep-clusters 2 --seed 3 --checkpoint-dir ckpt)
run(0 out err ${masked})
last_line("${out}" summary)
# The start event names the machine and the time (apps/common/report.h, machine_record).
expect_match("${out}" "\"machine\":{\"cpu\":\"[^\"]+\",\"cores\":[0-9]+,\"openmp_threads\":[1-9][0-9]*,\"blas_kernels\":\"[^\"]+\",\"cpu_isa\":\"(baseline|avx2|avx512)\",\"utc\":\"20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-9:]+Z\"}" "machine record")
expect_match("${out}" "\"event\":\"masked_task\",\"train_characters\":[1-9][0-9]*,\"seq_len\":48" "masked task line")
string(REGEX MATCH "\"test_hidden\":([0-9]+)" hidden "${out}")
if(CMAKE_MATCH_1 LESS 10)
  message(FATAL_ERROR "smoke: masked task hides only ${CMAKE_MATCH_1} test characters")
endif()
check_summary("${summary}" "full;clustered-4;i-clustered-4"
              "full;clustered-4;clustered-8;i-clustered-4;i-clustered-8;oracle-top" ckpt
              "masked-full-C4-seed3;masked-clustered-C4-seed3;masked-improved-clustered-C4-seed3" characters)
# The same checkpoints evaluated in batches of 2 windows: the same accuracies (the clustered attentions'
# hash planes are drawn afresh for every batch from one seed; they were drawn once per evaluation, so a
# window's planes depended on --eval-batch-size).
run(0 out2 err2 ${masked} --eval-batch-size 2)
last_line("${out2}" summary2)
foreach(cell full/clustered-4 full/clustered-8 clustered-4/i-clustered-4 i-clustered-4/oracle-top)
  string(REPLACE "/" ";" path "${cell}")
  expect_same_json("${summary}" "${summary2}" "masked task, eval batches of 2" table ${path} accuracy_mean)
endforeach()
# The Reformer columns on the masked task (RESULTS.md, "The Reformer columns at N = 512"): the
# sharing model and an LSH model with short chunks, evaluated under the Reformer key rule.
run(0 out err ${masked} --train shared-full,lsh-2 --lsh-rounds 1 --lsh-bucket-size 8 --checkpoint-dir ckpt-masked-lsh)
last_line("${out}" summary)
check_summary("${summary}" "shared-full;lsh-2" "shared-full;lsh-1;lsh-2;clustered-4;i-clustered-4;oracle-top"
              ckpt-masked-lsh "masked-shared-full-C4-seed3;masked-lsh-2-C4-bucket8-seed3" characters)
expect_match("${out}" "\"train_attention\":\"lsh-2\",\"eval_attention\":\"i-clustered-4\",[^}]*\"key_rule\":\"reformer\"" "masked key rule")
# Texts shorter than one window are refused, naming the option.
run(1 out err ${masked} --seq-len 100000 --checkpoint-dir ckpt-long)
expect_match("${err}" "shorter than one window of --seq-len 100000" "window longer than the texts")
