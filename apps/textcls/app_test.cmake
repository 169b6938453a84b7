# Tests of cf-textcls (run by CTest: cmake -DAPP=... -DWORK_DIR=... -DMODE=smoke|errors -P this file).
#   errors: bad command lines and config files exit with status 2 and a message
#           naming the bad option or key; a missing data folder exits with 1.
#   smoke:  a tiny config (two topics, a few steps) trains every attention, the
#           ablation and a k sweep, writes every table cell and the summary, and
#           reuses its checkpoints; exits with 77 (CTest: skipped) when the Debian
#           package fortunes is missing.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

if(MODE STREQUAL "errors")
  run(2 out err --attentions full,full)
  expect_match("${err}" "--attentions lists 'full' twice" "a repeated attention")
  check_option_errors(steps)

  run(2 out err --k -1)
  expect_match("${err}" "--k must be at least 0, got -1" "negative k")
  run(2 out err --attentions full,bigbird)
  expect_match("${err}" "--attentions: unknown attention 'bigbird'" "bad attention")
  run(2 out err --d-model 30 --n-heads 4)
  expect_match("${err}" "--d-model \\(30\\) must be divisible by --n-heads \\(4\\)" "heads")
  run(2 out err --seed 1 --seeds 1,2)
  expect_match("${err}" "give --seed or --seeds, not both" "seed and seeds")
  run(2 out err --precision fp8)
  expect_match("${err}" "--precision must be fp32, bf16 or fp16, got 'fp8'" "bad precision")
  run(2 out err --cuda-graph)
  expect_match("${err}" "--cuda-graph needs --device cuda, got --device cpu" "a CUDA graph on the CPU")
  run(2 out err --cuda-graph --device cuda --precision fp16)
  expect_match("${err}" "--cuda-graph does not take --precision fp16" "a CUDA graph with loss scaling")
  run(2 out err --pooling max)
  expect_match("${err}" "--pooling must be mean or first, got 'max'" "bad pooling")
  run(2 out err --ablation maybe)
  expect_match("${err}" "--ablation must be true or false, got 'maybe'" "bad bool")
  run(2 out err --ablation true --attentions full)
  expect_match("${err}" "add it to --attentions" "ablation without neural clustering")
  run(2 out err --ablation true --mu 0)
  expect_match("${err}" "--mu and --nu must be positive" "ablation with a zero weight")
  run(2 out err --loss-form unit)
  expect_match("${err}" "--loss-form must be inner, cosine or sphere, got 'unit'" "bad loss form")

  file(WRITE "${WORK_DIR}/bad_type.json" "{\"mu\": \"small\"}")
  run(2 out err --config bad_type.json)
  expect_match("${err}" "config key 'mu' must be a number" "mistyped config key")
  file(WRITE "${WORK_DIR}/bad_list.json" "{\"k_sweep\": [4, \"eight\"]}")
  run(2 out err --config bad_list.json)
  expect_match("${err}" "config key 'k_sweep' must be an array of integers" "mistyped list")

  run(2 out err --steps 10 --warmup 10)
  expect_match("${err}" "--warmup \\(10\\) must be less than --steps \\(10\\)" "warmup >= steps")
  run(1 out err --data-file "${WORK_DIR}/no-such.tsv" --steps 2 --warmup 1)
  expect_match("${err}" "\\[read_labelled_texts\\] .*no-such.tsv" "missing corpus file named")
  file(WRITE "${WORK_DIR}/bad.tsv" "a\ttext one\nno tab\n")
  run(1 out err --data-file bad.tsv --steps 2 --warmup 1)
  expect_match("${err}" "'bad.tsv' line 2: expected label<TAB>text" "bad corpus line named")
  run(1 out err --data-dir "${WORK_DIR}/no-such-dir" --steps 2 --warmup 1)
  expect_match("${err}" "no-such-dir" "missing data folder named")
  run(2 out err --data-file bad.tsv --data-dir fortunes)
  expect_match("${err}" "--data-file and --data-dir name two corpora \\('bad.tsv' and 'fortunes'\\); give one"
               "--data-file with --data-dir")
  return()
endif()

if(NOT MODE STREQUAL "smoke")
  message(FATAL_ERROR "MODE must be smoke or errors, got '${MODE}'")
endif()

if(NOT EXISTS /usr/share/games/fortunes/fortunes)
  message("fortunes is not installed (Debian package 'fortunes'): smoke test skipped")
  cmake_language(EXIT 77)  # CTest's SKIP_RETURN_CODE
endif()

# Topics of at least 600 texts, 40 texts each, a 1-layer d=16 model, 6 steps,
# every attention, the ablation and a k sweep.
set(tiny --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --steps 6 --batch-size 8 --warmup 2 --eval-every 3 --log-every 3 --attentions all --ablation true
    --k-sweep 2,4 --clusters 4 --topk 8 --lsh-bucket-size 8 --seed 3 --checkpoint-dir ckpt)
run(0 out err ${tiny})
set(out_first "${out}")  # (out is reused below)
last_line("${out}" summary)
string(JSON classes GET "${summary}" classes)
if(classes LESS 2)
  message(FATAL_ERROR "smoke: fewer than 2 classes: ${summary}")
endif()
string(JSON k GET "${summary}" k)
if(NOT k EQUAL 8)  # round(sqrt(64)): the paper's rule
  message(FATAL_ERROR "smoke: default k is ${k}, expected 8")
endif()
foreach(a full neural-clustering lsh routing clustered improved-clustered)
  string(JSON acc GET "${summary}" table ${a} accuracy_mean)
  string(JSON t GET "${summary}" table ${a} train_s_mean)
  string(JSON m GET "${summary}" table ${a} train_peak_mib_mean)
  if(acc LESS 0 OR acc GREATER 1 OR NOT t GREATER 0 OR NOT m GREATER 0)
    message(FATAL_ERROR "smoke: ${a}: accuracy ${acc}, train time ${t}, peak MiB ${m}")
  endif()
endforeach()
foreach(w N/N N/Y Y/N Y/Y)
  string(JSON acc GET "${summary}" ablation ${w} accuracy_mean)
endforeach()
# Y/Y is the main table's model (trained once).
string(JSON a1 GET "${summary}" ablation Y/Y accuracy_mean)
string(JSON a2 GET "${summary}" table neural-clustering accuracy_mean)
if(NOT a1 STREQUAL a2)
  message(FATAL_ERROR "smoke: ablation Y/Y (${a1}) is not the main table's neural clustering (${a2})")
endif()
foreach(kk 2 4)
  string(JSON acc GET "${summary}" k_sweep ${kk} accuracy_mean)
endforeach()
expect_match("${out}" "\"event\":\"train\",\"seed\":3,\"run\":\"routing\",\"step\":3," "train lines")
expect_match("${out}" "\"event\":\"val\",\"seed\":3,\"run\":\"full\",\"step\":6," "val lines")
expect_match("${err}" "\\| neural-clustering \\(k=8\\) \\|" "Markdown table")
expect_match("${err}" "\\| L1/L2 \\| N/N \\| N/Y \\| Y/N \\| Y/Y \\|" "ablation table")
expect_match("${err}" "\\| k=2 \\|" "k sweep table")
foreach(f full-seed3 neural-clustering-k8-muY-nuY-seed3 neural-clustering-k8-muN-nuN-seed3
          neural-clustering-k2-muY-nuY-seed3 lsh-seed3 routing-seed3 clustered-seed3 improved-clustered-seed3)
  if(NOT EXISTS "${WORK_DIR}/ckpt/${f}.safetensors")
    message(FATAL_ERROR "smoke: checkpoint ${f}.safetensors not written")
  endif()
endforeach()

# The second run reuses the finished checkpoints: no training, the same test accuracies, also with
# another evaluation batch size (every evaluation batch is padded to the longest text and sees the same
# hash draws: LSH, routing and neural clustering gave other accuracies with other batches).
run(0 out2 err2 ${tiny} --eval-batch-size 5)
last_line("${out2}" summary2)
expect_match("${out2}" "\"event\":\"resume\",\"seed\":3,\"run\":\"full\"" "resume line")
if(out2 MATCHES "\"event\":\"train\"")
  message(FATAL_ERROR "smoke: a finished checkpoint was trained again:\n${out2}")
endif()
foreach(a full neural-clustering lsh routing clustered improved-clustered)
  expect_same_json("${summary}" "${summary2}" "reloaded (eval batches of 5) vs trained" table ${a} accuracy_mean)
endforeach()
# Nothing was trained: no training time or memory (null, "–"), never a 0.
expect_null_json("${summary2}" "reused model" table full train_s_mean)
expect_match("${err2}" "\\| full \\| [0-9.]+ \\| – \\| – \\|" "reused rows show – for time and memory")
# A checkpoint written with other settings is refused, naming the file.
run(1 out err ${tiny} --mu 0.01)
expect_match("${err}" "checkpoint 'ckpt/neural-clustering-k8-muY-nuY-seed3.safetensors' was written with other settings" "stale checkpoint")

# --data-file: a corpus of labelled texts instead of the fortune files (two
# generated topics whose texts differ in their letters, 40 texts each).
set(corpus "")
foreach(i RANGE 1 40)
  string(APPEND corpus "vowels\taeiou ${i} aaee iioo uuaa eeii ${i} ooaa\n")
  string(APPEND corpus "consonants\tbcdfg ${i} bbcc ddff ggbb ${i} ccdd\n")
endforeach()
file(WRITE "${WORK_DIR}/corpus.tsv" "${corpus}")
run(0 out err --data-file corpus.tsv --min-texts 30 --min-chars 8 --max-len 32 --d-model 16 --n-heads 2
    --n-layers 1 --d-ff 32 --steps 4 --batch-size 8 --warmup 1 --attentions full --seed 3)
expect_match("${out}" "\"event\":\"data\",\"file\":\"corpus.tsv\",\"topics\":\\[\"consonants\",\"vowels\"\\]" "data line names the file and its topics")
last_line("${out}" summary_corpus)
string(JSON classes GET "${summary_corpus}" classes)
if(NOT classes EQUAL 2)
  message(FATAL_ERROR "smoke: the corpus file has 2 topics, the summary says ${classes}")
endif()
# Texts the model would see twice are dropped: a repeat within a topic (kept once) and a text under both
# topics (dropped from both; it could sit in the test split under one label and in training under the
# other), unless --keep-duplicates.
file(WRITE "${WORK_DIR}/dups.tsv" "${corpus}vowels\taeiou 1 aaee iioo uuaa eeii 1 ooaa\nvowels\tshared text\nconsonants\tshared text\n")
set(dup_args --data-file dups.tsv --min-texts 30 --min-chars 8 --max-len 32 --d-model 16 --n-heads 2 --n-layers 1
    --d-ff 32 --steps 2 --batch-size 8 --warmup 1 --attentions full --seed 3)
run(0 out err ${dup_args})
expect_match("${out}" "\"train\":56,\"val\":8,\"test\":16,.*\"duplicates_dropped\":3}" "duplicates dropped")
run(0 out err ${dup_args} --keep-duplicates true)
expect_match("${out}" "\"train\":59,\"val\":8,\"test\":16,.*\"duplicates_dropped\":0}" "duplicates kept")
# A split that leaves a topic no training text is refused (4 texts: 2 test, 2 validation).
run(1 out err --data-file corpus.tsv --min-texts 3 --max-per-class 4 --val-fraction 0.44 --test-fraction 0.44
    --min-chars 8 --max-len 32 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32 --steps 2 --warmup 1 --attentions full)
expect_match("${err}" "topic 'consonants' keeps 4 texts: 2 for the test and 2 for validation leave none to train on" "topic without training texts")
# The same file edited in place (the labels swapped) does not reuse the checkpoint trained on its old
# contents (the signature named the file only, so the old model was scored on the new labels).
set(corpus_args --data-file corpus.tsv --min-texts 30 --min-chars 8 --max-len 32 --d-model 16 --n-heads 2
    --n-layers 1 --d-ff 32 --steps 2 --batch-size 8 --warmup 1 --attentions full --seed 3 --checkpoint-dir ckpt-corpus)
run(0 out err ${corpus_args})
string(REPLACE "vowels\t" "SWAP\t" swapped "${corpus}")
string(REPLACE "consonants\t" "vowels\t" swapped "${swapped}")
string(REPLACE "SWAP\t" "consonants\t" swapped "${swapped}")
file(WRITE "${WORK_DIR}/corpus.tsv" "${swapped}")
run(1 out err ${corpus_args})
expect_match("${err}" "checkpoint 'ckpt-corpus/full-seed3.safetensors' was written with other settings \\(model, data or training options: data.contents" "edited data file")
file(WRITE "${WORK_DIR}/corpus.tsv" "${corpus}")
# The long-document corpus (scripts/bible_corpus.sh) when the Debian package
# bible-kjv is installed: 8 book groups, 1,189 chapters, each trainable.
find_program(BIBLE bible)
if(BIBLE)
  execute_process(COMMAND bash "${CMAKE_CURRENT_LIST_DIR}/../../scripts/bible_corpus.sh" "${WORK_DIR}/bible.tsv"
                  RESULT_VARIABLE rc ERROR_VARIABLE berr)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "smoke: scripts/bible_corpus.sh failed (${rc}): ${berr}")
  endif()
  run(0 out err --data-file bible.tsv --min-texts 50 --max-per-class 12 --max-len 256 --d-model 16 --n-heads 2
      --n-layers 1 --d-ff 32 --steps 2 --batch-size 8 --warmup 1 --attentions neural-clustering --seed 3)
  expect_match("${out}" "\"topics\":\\[\"general-epistles-revelation\",\"gospels-acts\",\"history\",\"law\",\"major-prophets\",\"minor-prophets\",\"pauline-epistles\",\"wisdom\"\\]" "the Bible's 8 book groups")
  expect_match("${berr}" "wrote 1189 chapters" "every chapter")
else()
  message("bible (Debian package bible-kjv) is not installed: the Bible corpus part is skipped")
endif()

# The bounded loss form (--loss-form cosine): the models with a weighted loss are
# new (their own checkpoints), the N/N model is the same model and is reused.
# (The sphere form the same way.)
foreach(form cosine sphere)
  run(0 out err ${tiny} --attentions neural-clustering --loss-form ${form})
  expect_match("${out}" "\"event\":\"resume\",\"seed\":3,\"run\":\"neural-clustering-k8-muN-nuN\"" "N/N reused (${form})")
  foreach(w muY-nuY muN-nuY muY-nuN)
    if(NOT EXISTS "${WORK_DIR}/ckpt/neural-clustering-k8-${w}-${form}-seed3.safetensors")
      message(FATAL_ERROR "smoke: checkpoint neural-clustering-k8-${w}-${form}-seed3.safetensors not written")
    endif()
  endforeach()
  expect_match("${err}" "phi: ${form}\\)" "ablation table names the form ${form}")
endforeach()

# --stop-after: full attention and routing trained in runs of 3 steps (exit 3 after
# each unfinished model) end with the uninterrupted run's accuracy and the same
# training loss over steps 4-6 (logged every 3 steps, so the windows line up): the
# data order and the generators resume with the model.
set(stopping --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --steps 6 --batch-size 8 --warmup 2 --eval-every 3 --log-every 3 --attentions full,routing --seed 3
    --checkpoint-dir ckpt-stop --stop-after 3)
run(3 out_s1 err_s ${stopping})
expect_match("${err_s}" "stopped after 3 steps as --stop-after asked: 'ckpt-stop/full-seed3.safetensors' holds step 3 of 6" "stop message")
run(3 out_s2 err_s ${stopping})
expect_match("${out_s2}" "\"event\":\"resume\",\"seed\":3,\"run\":\"full\",\"checkpoint\":\"ckpt-stop/full-seed3.safetensors\",\"step\":3" "resume line")
expect_match("${err_s}" "'ckpt-stop/routing-seed3.safetensors' holds step 3 of 6" "second model stopped")
run(0 out_s3 err_s ${stopping})
last_line("${out_s3}" summary_s)
foreach(a full routing)
  expect_same_json("${summary}" "${summary_s}" "trained in runs of 3 steps vs one run" table ${a} accuracy_mean)
  string(REGEX MATCH "\"event\":\"train\",\"seed\":3,\"run\":\"${a}\",\"step\":6,\"loss\":[^,]+" want "${out_first}")
  string(REGEX MATCH "\"event\":\"train\",\"seed\":3,\"run\":\"${a}\",\"step\":6,\"loss\":[^,]+" got "${out_s2}${out_s3}")
  if(want STREQUAL "" OR NOT want STREQUAL got)
    message(FATAL_ERROR "smoke: ${a}: the training loss of steps 4-6 in one run is '${want}', resumed '${got}'")
  endif()
endforeach()
# Routing was resumed by the last run: its training time is its two runs' sum
# (full, finished in the second run, is reused there: no time).
string(JSON t GET "${summary_s}" table routing train_s_mean)
if(NOT t GREATER 0)
  message(FATAL_ERROR "smoke: routing, trained over two runs, reports training time '${t}'")
endif()

# --precision (issue 26): bf16 and fp16 autocast training runs, and an fp16 run
# trained in two halves (--stop-after: the loss scaler's state resumes with the
# model) ends with the uninterrupted fp16 run's loss and accuracy. A checkpoint
# of another precision is refused.
set(half --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --steps 6 --batch-size 8 --warmup 2 --eval-every 3 --log-every 3 --attentions full --seed 3)
run(0 out_bf err_bf ${half} --precision bf16 --log-every 4)
last_line("${out_bf}" summary_bf)
# (the training loss of the last, shorter window is logged too: steps 5-6 after a line at step 4)
expect_match("${out_bf}" "\"event\":\"train\",\"seed\":3,\"run\":\"full\",\"step\":4,.*\"event\":\"train\",\"seed\":3,\"run\":\"full\",\"step\":6," "last partial log window")
string(JSON acc GET "${summary_bf}" table full accuracy_mean)
run(0 out_h err_h ${half} --precision fp16)
last_line("${out_h}" summary_h)
run(3 out_h1 err_h1 ${half} --precision fp16 --checkpoint-dir ckpt-fp16 --stop-after 3)
run(0 out_h2 err_h2 ${half} --precision fp16 --checkpoint-dir ckpt-fp16)
last_line("${out_h2}" summary_h2)
expect_same_json("${summary_h}" "${summary_h2}" "fp16 trained in two runs vs one" table full accuracy_mean)
string(REGEX MATCH "\"event\":\"train\",\"seed\":3,\"run\":\"full\",\"step\":6,\"loss\":[^,]+" want "${out_h}")
string(REGEX MATCH "\"event\":\"train\",\"seed\":3,\"run\":\"full\",\"step\":6,\"loss\":[^,]+" got "${out_h2}")
if(want STREQUAL "" OR NOT want STREQUAL got)
  message(FATAL_ERROR "smoke: fp16: the training loss of steps 4-6 in one run is '${want}', resumed '${got}'")
endif()
run(1 out err ${half} --precision bf16 --checkpoint-dir ckpt-fp16)
expect_match("${err}" "checkpoint 'ckpt-fp16/full-seed3.safetensors' was written with other settings" "precision in the signature")
expect_match("${err}" "options: precision \\(saved \"fp16\", now \"bf16\"\\)\\)" "the refusal names the setting that differs")
# Every attention trains under bf16 autocast (the clustering variants as float32
# islands); the default pair, full and neural clustering, used to stop at
# "[NeuralClusteringAttention] query_input is float32 but q is bfloat16".
run(0 out_all err_all --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1
    --d-ff 32 --steps 3 --batch-size 8 --warmup 1 --eval-every 3 --log-every 3 --attentions all --seed 3
    --precision bf16)
last_line("${out_all}" summary_all)
foreach(a full neural-clustering lsh routing clustered improved-clustered)
  string(JSON acc GET "${summary_all}" table ${a} accuracy_mean)
  if(acc LESS 0 OR acc GREATER 1)
    message(FATAL_ERROR "smoke: bf16 ${a}: accuracy ${acc}")
  endif()
endforeach()

# Issue 27: sizes that overflow or cannot be allocated are errors naming the
# shape or layer (defects 4 and 11: SIGSEGV, bare std::bad_alloc), and neural
# clustering with k above the sequence length is refused (defect 12).
set(small --min-texts 600 --max-per-class 40 --steps 2 --warmup 1 --attentions full --seed 3)
run(1 out err ${small} --max-len 64 --d-model 3818277671171063104 --n-heads 1)
expect_match("${err}" "shape \\([0-9]+,3818277671171063104\\) has more elements than int64 can count" "huge d_model")
file(WRITE "${WORK_DIR}/long.json" "{\"max_len\": 1000000000}")
run(1 out err ${small} --config long.json)
expect_match("${err}" "\\[SinusoidalPositionalEncoding\\] max_len 1000000000 x dim 64: \\[allocate\\] out of CPU memory" "huge max_len")
run(1 out err ${small} --max-len 32 --attentions neural-clustering --k 100000)
expect_match("${err}" "neural clustering with k = 100000 clusters exceeds the sequence length N = 32" "k > N")
run(1 out err ${small} --max-len 32 --attentions routing --routing-clusters 1000)
expect_match("${err}" "routing with clusters = 1000 exceeds the sequence length N = 32 tokens; use --routing-clusters <= 32"
             "routing clusters > N")
run(1 out err ${small} --max-len 32 --attentions lsh --lsh-bucket-size 1000)
expect_match("${err}" "lsh with a bucket size = 1000 exceeds the sequence length N = 32" "LSH bucket > N")
run(1 out err ${small} --max-len 32 --attentions clustered --clusters 100000)
expect_match("${err}" "clustered with clusters = 100000 exceeds the sequence length N = 32" "clusters > N")

# Issue 27, defect 8: a checkpoint whose step lies outside the run is refused,
# naming the file (it failed in DataLoader::set_state without it). The metadata
# is rewritten with Python's standard library (no numpy needed).
find_program(PY3 python3)
if(PY3)
  set(edit [=[
import json, struct, sys
p = sys.argv[1]
b = open(p, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
h['__metadata__']['step'] = '-5'
t = json.dumps(h, separators=(',', ':')).encode()
t += b' ' * (-len(t) % 8)
open(p, 'wb').write(struct.pack('<Q', len(t)) + t + b[8 + n:])
]=])
  file(WRITE "${WORK_DIR}/edit_step.py" "${edit}")
  file(MAKE_DIRECTORY "${WORK_DIR}/ckpt-neg")
  file(COPY_FILE "${WORK_DIR}/ckpt-stop/full-seed3.safetensors" "${WORK_DIR}/ckpt-neg/full-seed3.safetensors")
  execute_process(COMMAND "${PY3}" edit_step.py ckpt-neg/full-seed3.safetensors WORKING_DIRECTORY "${WORK_DIR}"
                  RESULT_VARIABLE py_rc)
  if(NOT py_rc EQUAL 0)
    message(FATAL_ERROR "smoke: editing the checkpoint's step failed")
  endif()
  set(negative --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
      --steps 6 --batch-size 8 --warmup 2 --eval-every 3 --log-every 3 --attentions full --seed 3
      --checkpoint-dir ckpt-neg)
  run(1 out err ${negative})
  # (refused by the checkpoint reader itself now, as save_checkpoint refuses writing it)
  expect_match("${err}" "ckpt-neg/full-seed3.safetensors.*bad step '-5'" "negative step")
endif()
