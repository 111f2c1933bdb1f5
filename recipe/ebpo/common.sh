# shellcheck shell=bash
# Shared settings of the EBPO recipes (Han et al., arXiv 2602.05165), sourced by run_<model>.sh.
# A per-model script sets MODEL_TAG, MODEL_PATH and the MODEL_OVERRIDES array (parallelism, memory),
# sources this file and calls `ebpo_main "$@"`. Every setting below can be changed from the environment;
# every extra argument of the run script is passed on, last, as a Hydra override.
#
#   ALGO          ebpo (default) | ebpo_bb | ebpo_batch | grpo | grpo_bn | drgrpo | dapo | entropy_mech |
#                 rloo | reinforce_pp                                               (presets: ebpo_algo_overrides)
#   GROUP_SIZE    responses per prompt G (actor_rollout_ref.rollout.n)                            default 4
#   ORDER         topic (default) | naive (file order, the paper's EBPO-naive) | difficulty | random
#   TOPICS        topic labels for ORDER=topic: embed (default: all-MiniLM-L6-v2 + UMAP + k-means, K=10,
#                 seed 42; the paper's BERTopic variant) or file (TRAIN_FILE already carries
#                 extra_info.topic, e.g. the paper's GPT-4.1 labels)
#   MODEL_PATH    HF id or local path of the policy                       (default: set by the model script)
#   WORK_DIR      root of everything below                                                default ./ebpo_runs
#   DATA_DIR      prepared parquet files (data_prep writes them here when missing)      default WORK_DIR/data
#   DATA_LOCAL_DIR  if set, data_prep.all reads the datasets from files there instead of the hub
#   TRAIN_FILE    training parquet                         default: derived from DATA_DIR, ORDER and TOPICS
#   CKPT_DIR      checkpoints go to CKPT_DIR/EXPERIMENT                                 default WORK_DIR/ckpt
#   LOG_DIR       metrics go to LOG_DIR/EXPERIMENT/metrics.jsonl (append-only across resumes)
#                                                                                        default WORK_DIR/logs
#   NNODES, GPUS_PER_NODE                                                                  default 4 and 8
#   PROJECT       trainer.project_name                                                         default ebpo
#   EXPERIMENT    trainer.experiment_name              default <MODEL_TAG>-<ALGO>-g<GROUP_SIZE>-<ORDER>
#   TOTAL_EPOCHS  passes over the training set          default 1 for ORDER=difficulty (the paper), else 3
#   TOTAL_STEPS   if set, trainer.total_training_steps (overrides the epoch count)
#   TEST_FREQ, SAVE_FREQ  validation / checkpoint period in steps                        default 10 and 10
#   VAL_N         samples per validation problem (Pass@1 = mean@VAL_N)                            default 16
#   PYTHON        interpreter with ebpo-verl installed                                        default python3
#   LOGGERS       trainer.logger, e.g. [console,wandb]; the tables read the append-only metrics log
#                 (trainer.metrics_log_path), written whatever the loggers                  default [console]
#
# Modes: DRY_RUN=1 prints the composed config (`python -m ebpo_verl.main --cfg job`) and exits without
# Ray, GPUs or data preparation; PRINT_OVERRIDES=1 prints the Hydra overrides, one per line, and exits.
# Evaluation is a separate stage: recipe/ebpo/eval.sh (python -m ebpo_verl.evaluate).

ALGO=${ALGO:-ebpo}
GROUP_SIZE=${GROUP_SIZE:-4}
ORDER=${ORDER:-topic}
TOPICS=${TOPICS:-embed}
WORK_DIR=${WORK_DIR:-$PWD/ebpo_runs}
DATA_DIR=${DATA_DIR:-$WORK_DIR/data}
CKPT_DIR=${CKPT_DIR:-$WORK_DIR/ckpt}
LOG_DIR=${LOG_DIR:-$WORK_DIR/logs}
NNODES=${NNODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
PROJECT=${PROJECT:-ebpo}
EXPERIMENT=${EXPERIMENT:-}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-10}
VAL_N=${VAL_N:-16}
PYTHON=${PYTHON:-python3}
LOGGERS=${LOGGERS:-[console]}
if [[ $ORDER == difficulty ]]; then TOTAL_EPOCHS=${TOTAL_EPOCHS:-1}; else TOTAL_EPOCHS=${TOTAL_EPOCHS:-3}; fi
TOTAL_STEPS=${TOTAL_STEPS:-}

# The paper's setup (arXiv 2602.05165, "Setup"): batch 512 prompts, PPO mini-batch 128, lr 1e-6,
# weight decay 0.01, KL loss 0.001, token-mean, prompt 4096 / response 8192, clip 0.2, temperature 1.0.
TRAIN_BATCH=512
MINI_BATCH=128
MAX_PROMPT=4096
MAX_RESPONSE=8192
# DAPO's soft overlong punishment: the last quarter of the response budget (DAPO: 4096 of 20480)
OVERLONG_BUFFER=2048

EBPO_RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VAL_SETS=(math500 aime2024 aime2025 amc23 olympiadbench)
PREP_SETS=(dapo_math "${VAL_SETS[@]}")

ebpo_die() {
  echo "ebpo recipe: $*" >&2
  exit 2
}

# Hydra list literal of quoted paths: ['a','b'].
ebpo_hydra_list() {
  local out="" item
  for item in "$@"; do
    [[ $item == *"'"* ]] && ebpo_die "path contains a single quote, which Hydra cannot take: $item"
    out+="${out:+,}'$item'"
  done
  printf '[%s]' "$out"
}

ebpo_algo_overrides() {
  local actor=actor_rollout_ref.actor
  case $ALGO in
    ebpo) OVERRIDES+=(algorithm.adv_estimator=ebpo) ;;
    ebpo_bb) OVERRIDES+=(algorithm.adv_estimator=ebpo ++algorithm.ebpo.prior=beta_binomial) ;;
    # the authors' released code: statistics of the current batch only, no memory across steps
    ebpo_batch) OVERRIDES+=(algorithm.adv_estimator=ebpo ++algorithm.ebpo.stats_scope=batch) ;;
    grpo) OVERRIDES+=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=True) ;;
    # GRPO with batch-std normalisation: EBPO with the shrinkage switched off (isolates S)
    grpo_bn) OVERRIDES+=(algorithm.adv_estimator=ebpo ++algorithm.ebpo.shrinkage=0 ++algorithm.ebpo.norm=batch) ;;
    # Dr.GRPO (Liu et al. 2025): no std division, constant-length loss normaliser, no KL term
    drgrpo)
      OVERRIDES+=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False
        "$actor.loss_agg_mode=seq-mean-token-sum-norm" "$actor.loss_scale_factor=$MAX_RESPONSE"
        "$actor.use_kl_loss=False")
      ;;
    # DAPO (Yu et al. 2025): clip-higher, dynamic sampling (v1 trainer's group filter on accuracy),
    # token-mean loss (shared setting), soft overlong punishment (dapo reward manager), no KL term
    dapo)
      OVERRIDES+=(algorithm.adv_estimator=grpo "$actor.clip_ratio_high=0.28"
        "$actor.use_kl_loss=False"
        algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc
        reward.reward_manager.name=dapo
        "++reward.reward_kwargs.max_resp_len=$MAX_RESPONSE"
        ++reward.reward_kwargs.overlong_buffer_cfg.enable=True
        "++reward.reward_kwargs.overlong_buffer_cfg.len=$OVERLONG_BUFFER"
        ++reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
        ++reward.reward_kwargs.overlong_buffer_cfg.log=False)
      ;;
    # the Entropy Mechanism paper's covariance-clipped policy loss (Cui et al. 2025), verl's defaults
    entropy_mech) OVERRIDES+=(algorithm.adv_estimator=grpo "$actor.policy_loss.loss_mode=clip_cov") ;;
    rloo) OVERRIDES+=(algorithm.adv_estimator=rloo) ;;
    reinforce_pp) OVERRIDES+=(algorithm.adv_estimator=reinforce_plus_plus_baseline) ;;
    *) ebpo_die "unknown ALGO=$ALGO (ebpo ebpo_bb ebpo_batch grpo grpo_bn drgrpo dapo entropy_mech rloo reinforce_pp)" ;;
  esac
}

ebpo_order_overrides() {
  local cur=++data.curriculum
  OVERRIDES+=(data.custom_cls.path=pkg://ebpo_verl.curriculum data.custom_cls.name=CurriculumDataset
    data.shuffle=False data.seed=42 data.dataloader_num_workers=0)
  case $ORDER in
    topic) OVERRIDES+=("$cur.order=topic" "$cur.topic_key=topic" "$cur.align=True") ;;
    naive) OVERRIDES+=("$cur.order=native") ;;
    random) OVERRIDES+=("$cur.order=random") ;;
    difficulty) OVERRIDES+=("$cur.order=difficulty" "$cur.difficulty_key=pass_rate") ;;
    *) ebpo_die "unknown ORDER=$ORDER (topic naive difficulty random)" ;;
  esac
}

# Sets TRAIN_PATH, the training parquet for this ORDER: topic order needs topic labels (DAPO-Math has
# none), difficulty order needs the policy's own pass rates (16 rollouts at temperature 1.0, on a GPU).
ebpo_train_file() {
  if [[ -n ${TRAIN_FILE:-} ]]; then
    TRAIN_PATH=$TRAIN_FILE
  elif [[ $ORDER == topic && $TOPICS == embed ]]; then
    TRAIN_PATH=$DATA_DIR/dapo_math.topics_k10.parquet
  elif [[ $ORDER == topic ]]; then
    ebpo_die "TOPICS=$TOPICS needs TRAIN_FILE=<parquet whose extra_info carries 'topic'>"
  elif [[ $ORDER == difficulty ]]; then
    TRAIN_PATH=$DATA_DIR/dapo_math.pass_rate.${MODEL_PATH##*/}.parquet
  else
    TRAIN_PATH=$DATA_DIR/dapo_math.parquet
  fi
}

# Runs one preparation command, or with DRY_RUN only lists it on stderr.
ebpo_step() {
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    echo "DRY_RUN: would prepare data: $*" >&2
  else
    echo "ebpo recipe: $*" >&2
    "$@" || ebpo_die "data preparation failed: $*"
  fi
}

# Prepares whatever is missing: the parquet files (data_prep.all) and the training file's labels.
ebpo_prepare_data() {
  local train=$1 name missing=0
  for name in "${PREP_SETS[@]}"; do [[ -f $DATA_DIR/$name.parquet ]] || missing=1; done
  if ((missing)); then
    ebpo_step "$PYTHON" -m data_prep.all --out-dir "$DATA_DIR" --only "${PREP_SETS[@]}" \
      ${DATA_LOCAL_DIR:+--local-dir "$DATA_LOCAL_DIR"}
  fi
  if [[ ! -f $train && -z ${TRAIN_FILE:-} ]]; then
    case $ORDER in
      topic) ebpo_step "$PYTHON" -m data_prep.label_topics --in "$DATA_DIR/dapo_math.parquet" --out "$train" \
        --k 10 --seed 42 ;;
      difficulty) ebpo_step "$PYTHON" -m data_prep.estimate_pass_rate --model "$MODEL_PATH" \
        --in "$DATA_DIR/dapo_math.parquet" --out "$train" --n 16 --temperature 1.0 ;;
    esac
  fi
  [[ ${DRY_RUN:-0} == 1 || -f $train ]] || ebpo_die "training file not found: $train"
}

ebpo_common_overrides() {
  local actor=actor_rollout_ref.actor rollout=actor_rollout_ref.rollout val
  local val_files=()
  for val in "${VAL_SETS[@]}"; do val_files+=("$DATA_DIR/$val.parquet"); done
  OVERRIDES+=(
    "data.val_files=$(ebpo_hydra_list "${val_files[@]}")"
    "data.train_batch_size=$TRAIN_BATCH" "data.max_prompt_length=$MAX_PROMPT"
    data.filter_overlong_prompts=True data.truncation=error
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "$actor.optim.lr=1e-6" "$actor.optim.weight_decay=0.01" "$actor.ppo_mini_batch_size=$MINI_BATCH"
    "$actor.use_kl_loss=True" "$actor.kl_loss_coef=0.001" "$actor.kl_loss_type=low_var_kl"
    "$actor.loss_agg_mode=token-mean" "$actor.clip_ratio_low=0.2" "$actor.clip_ratio_high=0.2"
    "$actor.entropy_coeff=0" "$actor.use_dynamic_bsz=True"
    algorithm.use_kl_in_reward=False
    "$rollout.name=vllm" "$rollout.n=$GROUP_SIZE" "$rollout.temperature=1.0" "$rollout.top_p=1.0"
    "$rollout.val_kwargs.n=$VAL_N" "$rollout.val_kwargs.temperature=1.0" "$rollout.val_kwargs.top_p=1.0"
    "$rollout.val_kwargs.do_sample=True"
    "trainer.logger=$LOGGERS" "trainer.project_name=$PROJECT" "trainer.experiment_name=$EXPERIMENT"
    "trainer.nnodes=$NNODES" "trainer.n_gpus_per_node=$GPUS_PER_NODE"
    "trainer.default_local_dir=$CKPT_DIR/$EXPERIMENT"
    "trainer.metrics_log_path=$LOG_DIR/$EXPERIMENT/metrics.jsonl"
  )
}

ebpo_main() {
  local train
  : "${MODEL_TAG:?set by the model script}" "${MODEL_PATH:?set by the model script or the environment}"
  EXPERIMENT=${EXPERIMENT:-$MODEL_TAG-$ALGO-g$GROUP_SIZE-$ORDER}
  OVERRIDES=()
  ebpo_train_file
  train=$TRAIN_PATH
  ebpo_common_overrides
  ebpo_order_overrides
  OVERRIDES+=("data.train_files=$(ebpo_hydra_list "$train")")
  OVERRIDES+=("data.max_response_length=$MAX_RESPONSE" "trainer.total_epochs=$TOTAL_EPOCHS"
    "trainer.test_freq=$TEST_FREQ" "trainer.save_freq=$SAVE_FREQ" trainer.val_before_train=True)
  [[ -n $TOTAL_STEPS ]] && OVERRIDES+=("trainer.total_training_steps=$TOTAL_STEPS")
  ebpo_algo_overrides
  OVERRIDES+=("${MODEL_OVERRIDES[@]}" "$@")

  if [[ ${PRINT_OVERRIDES:-0} == 1 ]]; then
    printf '%s\n' "${OVERRIDES[@]}"
    return 0
  fi
  ebpo_prepare_data "$train"
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    exec "$PYTHON" -m ebpo_verl.main --cfg job "${OVERRIDES[@]}"
  fi
  mkdir -p "$LOG_DIR/$EXPERIMENT"
  exec "$PYTHON" -m ebpo_verl.main "${OVERRIDES[@]}"
}

# ---------------------------------------------------------------------------------------------------
# Table drivers (table_*.sh): register experiments with ebpo_experiment, then call ebpo_drive "$@".
#   FINAL_EVAL    1 (default): after training, evaluate the final checkpoint with eval.sh (20,480 tokens)
#                 and tabulate that; 0: tabulate the training run's own validation (8,192 tokens)
#   SELECT        final (default) | best: which validation of a run the table reports
#   RESULTS_DIR   where the tables go                                            default WORK_DIR/results
# `table_X.sh --list` prints the experiments (section, method, experiment, metrics file, command) and
# exits; other arguments are Hydra overrides for every run. A finished training run (LOG_DIR/<name>/.done)
# or evaluation (LOG_DIR/eval-<name>/.done) is not run again, so drivers share runs (e.g. the EBPO rows of
# the main and ordering tables) and can be restarted after a failure.

EXP_SECTIONS=()
EXP_METHODS=()
EXP_NAMES=()
EXP_SCRIPTS=()
EXP_ENVS=()

# ebpo_experiment SECTION METHOD MODEL NAME [VAR=VALUE ...]: one training run of run_MODEL.sh.
ebpo_experiment() {
  local section=$1 method=$2 model=$3 name=$4
  shift 4
  [[ -f $EBPO_RECIPE_DIR/run_$model.sh ]] || ebpo_die "no recipe run_$model.sh"
  local existing
  for existing in "${EXP_NAMES[@]}"; do
    [[ $existing == "$name" ]] && ebpo_die "experiment name used twice: $name"
  done
  EXP_SECTIONS+=("$section")
  EXP_METHODS+=("$method")
  EXP_NAMES+=("$name")
  EXP_SCRIPTS+=("$model")
  EXP_ENVS+=("MODEL=$model $*")
}

# The run directory whose metrics the table reads for experiment NAME.
ebpo_metrics_dir() {
  if [[ ${FINAL_EVAL:-1} == 1 ]]; then echo "$LOG_DIR/eval-$1"; else echo "$LOG_DIR/$1"; fi
}

# ebpo_drive TABLE [--list | hydra overrides...]
ebpo_drive() {
  local table=$1 i name env_words failed=() specs=()
  shift
  local results=${RESULTS_DIR:-$WORK_DIR/results}
  if [[ ${1:-} == --list ]]; then
    printf 'section\tmethod\texperiment\tmetrics\tcommand\n'
    for i in "${!EXP_NAMES[@]}"; do
      printf '%s\t%s\t%s\t%s\t%s\n' "${EXP_SECTIONS[i]}" "${EXP_METHODS[i]}" "${EXP_NAMES[i]}" \
        "$(ebpo_metrics_dir "${EXP_NAMES[i]}")/metrics.jsonl" \
        "${EXP_ENVS[i]} EXPERIMENT=${EXP_NAMES[i]} bash $EBPO_RECIPE_DIR/run_${EXP_SCRIPTS[i]}.sh"
    done
    return 0
  fi
  export WORK_DIR DATA_DIR CKPT_DIR LOG_DIR PYTHON
  for i in "${!EXP_NAMES[@]}"; do
    name=${EXP_NAMES[i]}
    specs+=("${EXP_SECTIONS[i]}/${EXP_METHODS[i]}=$(ebpo_metrics_dir "$name")")
    read -ra env_words <<<"${EXP_ENVS[i]}"
    if [[ -f $LOG_DIR/$name/.done ]]; then
      echo "== $name: trained before, not run again" >&2
    else
      echo "== $name: ${EXP_ENVS[i]}" >&2
      if ! env "${env_words[@]}" EXPERIMENT="$name" bash "$EBPO_RECIPE_DIR/run_${EXP_SCRIPTS[i]}.sh" "$@"; then
        failed+=("$name (training)")
        continue
      fi
      touch "$LOG_DIR/$name/.done"
    fi
    if [[ ${FINAL_EVAL:-1} == 1 && ! -f $LOG_DIR/eval-$name/.done ]]; then
      if ! env "${env_words[@]}" EXPERIMENT="eval-$name" bash "$EBPO_RECIPE_DIR/eval.sh" "$CKPT_DIR/$name"; then
        failed+=("$name (evaluation)")
        continue
      fi
      touch "$LOG_DIR/eval-$name/.done"
    fi
  done
  "$PYTHON" "$EBPO_RECIPE_DIR/../../scripts/make_tables.py" --table "$table" --select "${SELECT:-final}" \
    --out "$results" "${specs[@]}"
  if ((${#failed[@]})); then
    ebpo_die "failed runs (their cells are empty): ${failed[*]}"
  fi
}
