# The apps under `mpirun -np 2 ... --distributed` (CTest dist_apps_np2; run as
# cmake -DMPIRUN=... -DKMEANS=... -DTEXTCLS=... -DLM=... -DWORK_DIR=... -P this file).
# Each distributed run must agree with one process on the same data and global
# batch: cf-kmeans exactly (the same assignments file), cf-textcls and cf-lm in
# their logged training losses (float32 sums in another order: 1e-4 relative),
# and only rank 0 prints.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
separate_arguments(MPIRUN)

function(run_cmd out_var)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE err TIMEOUT 300)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ARGN}: exit status ${rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The "train" lines' losses, in order, as a list.
function(train_losses text out_var)
  set(losses "")
  string(REPLACE "\n" ";" lines "${text}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^\\{\"event\":\"train\"")
      string(JSON loss GET "${line}" loss)
      list(APPEND losses "${loss}")
    endif()
  endforeach()
  set(${out_var} "${losses}" PARENT_SCOPE)
endfunction()

function(expect_close_losses one two what)
  train_losses("${one}" a)
  train_losses("${two}" b)
  list(LENGTH a na)
  list(LENGTH b nb)
  if(na EQUAL 0 OR NOT na EQUAL nb)
    message(FATAL_ERROR "${what}: ${na} train lines from one process, ${nb} from two (rank 0 only must print)\n${two}")
  endif()
  math(EXPR last "${na} - 1")
  foreach(i RANGE ${last})
    list(GET a ${i} x)
    list(GET b ${i} y)
    if(x STREQUAL y)
      continue()
    endif()
    # CMake has no floating point: the first 5 significant digits may differ by 1
    # (about 1e-4 relative; the losses here are of order 1, same exponent).
    string(REGEX MATCH "[1-9][0-9.]*" xs "${x}")
    string(REGEX MATCH "[1-9][0-9.]*" ys "${y}")
    string(REPLACE "." "" xs "${xs}")
    string(REPLACE "." "" ys "${ys}")
    string(SUBSTRING "${xs}" 0 5 x5)
    string(SUBSTRING "${ys}" 0 5 y5)
    math(EXPR diff "${x5} - ${y5}")
    if(diff GREATER 1 OR diff LESS -1)
      message(FATAL_ERROR "${what}: train loss ${i}: one process ${x}, two processes ${y}")
    endif()
  endforeach()
endfunction()

function(expect_match_summary text)
  string(REGEX MATCHALL "\"event\":\"summary\"" summaries "${text}")
  list(LENGTH summaries ns)
  if(NOT ns EQUAL 1)
    message(FATAL_ERROR "${ns} summaries (rank 0 only must print one)\n${text}")
  endif()
endfunction()

# ---- cf-kmeans: the demo data clustered by one process and by two ----
run_cmd(one ${KMEANS} --demo-n 3000 --demo-d 8 --k 6 --seed 2 --save-data data.npy --assignments one.npy
        --centroids c1.npy)
run_cmd(two ${MPIRUN} -np 2 ${KMEANS} --distributed --input data.npy --k 6 --seed 2 --assignments two.npy
        --centroids c2.npy)
file(SHA256 "${WORK_DIR}/one.npy" h1)
file(SHA256 "${WORK_DIR}/two.npy" h2)
if(NOT h1 STREQUAL h2)
  message(FATAL_ERROR "cf-kmeans --distributed assigned other clusters than one process\n${two}")
endif()
expect_match_summary("${two}")

# ---- cf-textcls and cf-lm: the same global batches, one process and two ----
# With dropout: each rank draws its block of the masks one process draws for the
# whole batch (autograd/dropout_share.h; every rank drew rank 0's masks before).
set(textcls --min-texts 600 --max-per-class 40 --max-len 64 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --steps 4 --batch-size 8 --warmup 1 --eval-every 0 --log-every 1 --attentions full,neural-clustering
    --clusters 4 --seed 3 --dropout 0.2)
# A global batch the ranks cannot share evenly: a usage error (status 2) before any data is read,
# said once (by rank 0).
string(REPLACE "--batch-size;8" "--batch-size;7" textcls7 "${textcls}")
execute_process(COMMAND ${MPIRUN} -np 2 ${TEXTCLS} --distributed ${textcls7}
  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
string(REGEX MATCHALL "must be a multiple of the number of processes" said "${err}")
list(LENGTH said times)
if(rc EQUAL 0 OR NOT times EQUAL 1 OR out MATCHES "\"event\":\"data\"")
  message(FATAL_ERROR "--batch-size 7 on 2 ranks: status ${rc}, said ${times} times\nstdout:\n${out}\nstderr:\n${err}")
endif()
run_cmd(one ${TEXTCLS} ${textcls})
run_cmd(two ${MPIRUN} -np 2 ${TEXTCLS} --distributed ${textcls})
expect_close_losses("${one}" "${two}" "cf-textcls --distributed")

# The Cluster-Former model's memory banks cluster the union of the ranks' banks,
# which hold the states in rank-major rather than batch order, so k-means++ may
# seed differently from one process: the models without a bank are compared,
# the cluster-former one only runs (and its banks' distributed K-Means with it).
set(lm --seq-len 32 --batch-size 4 --eval-windows 4 --n-layers 2 --d-model 16 --n-heads 2 --d-ff 32
    --window 8 --stride 4 --cluster-layers 1 --clusters 4 --memory-size 256 --update-every 2 --kmeans-iters 5
    --steps 4 --warmup 1 --eval-every 0 --log-every 1 --retrieval false --seed 2 --dropout 0.2)
run_cmd(one ${LM} ${lm} --models sliding-window,neural-clustering)
run_cmd(two ${MPIRUN} -np 2 ${LM} --distributed ${lm} --models sliding-window,neural-clustering)
expect_close_losses("${one}" "${two}" "cf-lm --distributed")
run_cmd(two ${MPIRUN} -np 2 ${LM} --distributed ${lm} --models cluster-former)
expect_match_summary("${two}")
