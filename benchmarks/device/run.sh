#!/usr/bin/env bash
# Everything that needs a machine of many cores and a GPU, in one command, on a machine without a package
# registry: from the project's root, with .dev/ filled by benchmarks/device/prepare.sh (and carried there):
#     SKIP="cluster dense" bash benchmarks/device/run.sh     (9 minutes at most: DEADLINE, below)
# Installs outcore from the tree (its C extensions built against .dev/jpeg) and what the machine lacks (.dev/whl),
# then runs each step time-boxed, the most telling first, its log in $OUT (default /tmp/out), and prints the tables.
# The whole run ends DEADLINE seconds (default 540) after it began, tables printed, inside one device call (600 s
# at most): each step gets its own limit or what is left, whichever is less, and a step with too little left is
# skipped, saying so (run it alone with SKIP naming the others). The steps, in order:
#   gputests    the tests that need a CUDA GPU (they skip elsewhere): pinned batches (ds.torch, Keras' torch backend),
#               to_device, nvJPEG decoding
#   imagenet    benchmarks/imagenet.py: full-size JPEGs, RandomResizedCrop(224) + flip, against its ceiling
#   gpu         benchmarks/gpu_training.py: does the GPU wait? a small ResNet (and ResNet-50 on RRC; Keras' fit) fed by outcore
#   processes   benchmarks/cores.py: the same batches made by 1, 2 and 4 loader processes (process=k, each its part of
#               every batch, on 16/k threads) against 16 threads in the consumer's process
#   feed        benchmarks/cores.py's stand-in training step (5 ms, 80 % holding the GIL) fed in its process by threads,
#               by a process of their own (process=True), by 4 (process=4) or by 1 or 4 DataLoader workers: the ratio
#               to its own rate, and the CPU a batch costs the loop's thread
#   cores       benchmarks/cores.py: ds.batches on 1-16 threads (pixels, crop + flip, with Normalize, RandomResizedCrop
#               of 8- and 16-bit pictures;
#               encoded, crop + flip, ScaleJitter + flip; JPEGs with a phone's EXIF, crop + flip; PNGs; the fused RRC), the GIL share timed (at 16 threads, split by thread: the consumer's, the pool's, the planning thread's),
#               against its ceiling (as many one-thread copies side by side, each a process of its own: what the
#               machine's cores, memory and hardware threads give), ds.torch with 0-16 workers
#   pread       the cores step's pixel rows with every chunk read by pread (OUTCORE_MAP_FILES=0), not in place through
#               its file's mapping: what reading in place gives 16 cores
#   frames      benchmarks/raw_frames.py: a pixel store's batches on 1, 8 and 16 threads with every chunk in its lz4
#               frame, with chunks that barely compress stored raw (the default) and with compression="none": what
#               one pass over each chunk's bytes, not two, gives 16 cores sharing a memory
#   where       benchmarks/where_cpu.py: where 16 threads' CPU time goes (perf, every thread, the kernel's part too):
#               outcore's C calls by what they do, and the rest by Python function (needs perf on the machine)
#   gpu_decode  benchmarks/device/gpu_decode.py: torchvision's nvJPEG decode on the GPU (the GPU's own anchor), and
#               ds.torch(decode="cuda") against outcore's CPU path on the same files
#   ingest      benchmarks/ingest_scale.py: whole ingests of ImageNet-like JPEGs on 1 and 16 threads, timed by phase
#   bench       outcore bench of the pixel store: its advice, with the GIL share and process=2, 4, 8 timed where
#               that share keeps one process's threads from the 16 cores
#   cluster     benchmarks/cluster.py: 1-8 Dask workers decoding, cropping and flipping
#   dense       benchmarks/dense_targets.py: crops and flips of pictures with their instance maps, boxes and keypoints,
#               against torchvision v2 on tv_tensors in a DataLoader with a worker per core
set -u
started=$(date +%s)
DEADLINE=${DEADLINE:-540}  # seconds from the start to the last table printed
PRINTING=10                # kept for printing the tables
SHORTEST=20                # a step with less left is skipped
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
root=$PWD
jpeg=$root/.dev/jpeg
work=/tmp/bench  # each step makes its own folder here: any step runs without the others
mkdir -p "$work"
[ -d "$root/.dev/whl" ] || { echo "no .dev/whl here: run benchmarks/device/prepare.sh on a machine with a registry, carry .dev" >&2; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=$jpeg/lib PATH=/tmp/site/bin:$PATH
OUTCORE_JPEG_PREFIX=$jpeg python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile --target /tmp/site . \
    > "$OUT/install.log" 2>&1 || { echo "install failed"; tail "$OUT/install.log"; exit 4; }
{ nproc; lscpu | grep -E '^(Model name|Socket|Core|Thread|NUMA node\(s\)|L3)'; nvidia-smi -L; (cd /tmp && python3 -c "from outcore.cli.info import system_report; print(system_report())"); } 2>&1 | tee "$OUT/env.log"

step() {  # step NAME SECONDS COMMAND...: run in benchmarks/, time-boxed (by the deadline too), logged
    local name=$1 limit=$2
    shift 2
    case " ${SKIP:-} " in *" $name "*) return ;; esac
    local began left
    began=$(date +%s)
    left=$((started + DEADLINE - PRINTING - began))
    if [ "$left" -lt "$SHORTEST" ]; then
        echo "$name: skipped, ${left} s left before the deadline (DEADLINE=$DEADLINE)" | tee "$OUT/$name.log"
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    (cd "$root/benchmarks" && timeout -k 5 "$limit" "$@") > "$OUT/$name.log" 2>&1
    echo "$name: rc=$? in $(($(date +%s) - began)) s (limit $limit s)"
}

tests=$root/tests
step gputests 80 bash -c "cd /tmp && python3 -m pytest -q -p no:cacheprovider -W default -c $root/pyproject.toml \
    $tests/test_torch.py $tests/test_torch_decode.py $tests/test_advice.py $tests/test_keras_tf.py \
    -k 'cuda or gpu or nvjpeg or pin or device'"
step imagenet 80 python3 imagenet.py --images 4000 --workdir $work/inet --skip-validation --only "own sizes,max_side,Pillow"
step gpu 240 python3 gpu_training.py --samples 10000 --steps 200 --workdir $work/gt --imagenet $work/inet/train
step processes 90 python3 cores.py --images 6000 --threads 16 --seconds 2 --only processes --processes 1,2,4 \
    --cases pixels,encoded+crop --workdir $work/cores
step feed 75 python3 cores.py --images 6000 --only feed --cases pixels,encoded --seconds 3 --step-ms 5 --held 0.8 \
    --feed-workers 0,process,process4,1,4 --workdir $work/cores
step cores 420 python3 cores.py --images 6000 --threads 1,4,8,16 --seconds 2 --torch-workers 0,4,8,16 \
    --only scaling,apart,torch \
    --cases pixels,pixels+crop,pixels+crop+norm,pixels+rrc,pixels16+rrc,pixels+crop+bc,pixels+crop+norm16,encoded,encoded+crop,encoded+jitter,exif+crop,png,rrc \
    --workdir $work/cores
step pread 45 env OUTCORE_MAP_FILES=0 python3 cores.py --images 6000 --threads 1,8,16 --seconds 2 --only scaling \
    --cases pixels,pixels+crop --workdir $work/cores
step frames 60 python3 raw_frames.py --images 6000 --threads 1,8,16 --repeats 1 --epochs 3 --workdir $work/cores
step where 60 python3 where_cpu.py --images 6000 --threads 16 --seconds 5 --cases pixels,encoded --workdir $work/cores
step gpu_decode 60 python3 device/gpu_decode.py $work/inet/train 2 --store $work/inet/own.zarr
step ingest 70 python3 ingest_scale.py --files 10000 --threads 1,16 --repeats 1 --workdir $work/ingest
step bench 60 outcore bench $work/cores/pixels.zarr --repeats 1
step cluster 100 python3 cluster.py --images 8000 --size 256 --copies 2 --crop-flip --workers 1,2,4,8 --settings outcore --repeats 1 --workdir $work/cluster
step dense 75 python3 dense_targets.py --images 2048 --batch 64 --repeats 2 --workdir $work/dense
for log in "$OUT"/*.log; do
    echo "== $log"
    tr '\r' '\n' < "$log" | grep -v '%|' | tail -n 40
done
