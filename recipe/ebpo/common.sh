# shellcheck shell=bash
# Shared settings of the EBPO recipes (Han et al., arXiv 2602.05165), sourced by run_<model>.sh.
# A per-model script sets MODEL_TAG, MODEL_PATH and the MODEL_OVERRIDES array (parallelism, memory),
# sources this file and calls `ebpo_main "$@"`. Every setting below can be changed from the environment;
# every extra argument of the run script is passed on, last, as a Hydra override.
#
#   ALGO          ebpo (default) | ebpo_bb | ebpo_batch | grpo | grpo_bn | drgrpo | dapo | entropy_mech |
#                 rloo | reinforce_pp | spo | bnpo | js                             (presets: ebpo_algo_overrides)
#   BASELINES     paper (default: each baseline as the authors ran it; recipe/ebpo/README.md, Switches) |
#                 canonical (each baseline as its own paper and verl's docs define it)
#   REWARD        paper (default: the authors' training reward, verl's DAPO/Minerva `Answer:` rule, +1/-1,
#                 ebpo_verl.paper_reward) | math_verify (ebpo_verl.reward: math-verify, 1/0)
#   GROUP_SIZE    responses per prompt G (actor_rollout_ref.rollout.n), an integer >= 2 (>= 1 for spo) default 4
#   ORDER         topic (default) | naive (file order, the paper's EBPO-naive) | difficulty | random
#   TOPICS        topic labels for ORDER=topic: embed (default: all-MiniLM-L6-v2 + UMAP + k-means, K=10,
#                 seed 42; the paper's BERTopic variant) or file (TRAIN_FILE already carries
#                 extra_info.topic, e.g. the paper's GPT-4.1 labels)
#   MODEL_PATH    HF id or local path of the policy                       (default: set by the model script)
#   WORK_DIR      root of everything below; on a multi-node cluster a folder every node sees at the same
#                 path (shared filesystem; checked on every node before training)        default ./ebpo_runs
#   DATA_DIR      prepared parquet files (data_prep writes them here when missing)      default WORK_DIR/data
#   DATA_LOCAL_DIR  if set, data_prep.all reads the datasets from files there instead of the hub
#   TRAIN_FILE    training parquet                         default: derived from DATA_DIR, ORDER and TOPICS
#   CKPT_DIR      checkpoints go to CKPT_DIR/EXPERIMENT                                 default WORK_DIR/ckpt
#   KEEP_CKPTS    checkpoints kept per run (trainer.max_actor_ckpt_to_keep; one verl FSDP checkpoint is
#                 ~12 bytes per parameter: ~100 GB for Qwen3-8B, ~180 GB for Qwen3-14B)        default 2
#   LOG_DIR       metrics go to LOG_DIR/EXPERIMENT/metrics.jsonl (append-only across resumes)
#                                                                                        default WORK_DIR/logs
#   NNODES, GPUS_PER_NODE                                                                  default 4 and 8
#   PROJECT       trainer.project_name                                                         default ebpo
#   EXPERIMENT    trainer.experiment_name  default <MODEL_TAG>-<ALGO>-g<GROUP_SIZE>-<ORDER>-rw_<REWARD>-bl_<BASELINES>
#   TOTAL_STEPS   if set, trainer.total_training_steps (the run stops there)
#   TOTAL_EPOCHS  passes over the training set   default TOTAL_STEPS when that is set (never the limit), else
#                 1 for ORDER=difficulty (the paper) and 3 otherwise
#   TEST_FREQ, SAVE_FREQ  validation / checkpoint period in steps (-1: never)               default 10 and 10
#   VAL_SETS      validation sets during training, comma separated, of math500 aime2024 aime2025 amc23
#                 olympiadbench                                                          default all five
#   VAL_N         samples per validation problem (Pass@1 = mean@VAL_N)                            default 16
#   PYTHON        interpreter with ebpo-verl installed                                        default python3
#   LOGGERS       trainer.logger, e.g. [console,wandb]; the tables read the append-only metrics log
#                 (trainer.metrics_log_path), written whatever the loggers                  default [console]
#
# Modes: DRY_RUN=1 runs the pre-flight (`python -m ebpo_verl.main --cfg job`: our checks, verl's
# validate_config at NNODES x GPUS_PER_NODE, at least one step per epoch when the training file exists),
# prints the composed config and "pre-flight passed", and exits without Ray, GPUs, data preparation or any
# file written; PRINT_OVERRIDES=1 prints the Hydra overrides, one per line, and exits; --help prints this.
# Evaluation is a separate stage: recipe/ebpo/eval.sh (python -m ebpo_verl.evaluate).

ALGO=${ALGO:-ebpo}
BASELINES=${BASELINES:-paper}
REWARD=${REWARD:-paper}
GROUP_SIZE=${GROUP_SIZE:-4}
ORDER=${ORDER:-topic}
TOPICS=${TOPICS:-embed}
WORK_DIR=${WORK_DIR:-$PWD/ebpo_runs}
DATA_DIR=${DATA_DIR:-$WORK_DIR/data}
CKPT_DIR=${CKPT_DIR:-$WORK_DIR/ckpt}
LOG_DIR=${LOG_DIR:-$WORK_DIR/logs}
KEEP_CKPTS=${KEEP_CKPTS:-2}
NNODES=${NNODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
PROJECT=${PROJECT:-ebpo}
EXPERIMENT=${EXPERIMENT:-}
PYTHON=${PYTHON:-python3}
LOGGERS=${LOGGERS:-[console]}
# TOTAL_STEPS, TOTAL_EPOCHS, TEST_FREQ, SAVE_FREQ, VAL_SETS and VAL_N get their defaults in
# ebpo_schedule_defaults (after a table driver's ebpo_paper_schedule has had its say).

# The paper's setup (arXiv 2602.05165, "Setup"): batch 512 prompts, PPO mini-batch 128, lr 1e-6,
# weight decay 0.01, KL loss 0.001, token-mean, prompt 4096 / response 8192, clip 0.2, temperature 1.0.
TRAIN_BATCH=512
MINI_BATCH=128
MAX_PROMPT=4096
MAX_RESPONSE=8192
# DAPO's soft overlong punishment (canonical DAPO): the last quarter of the response budget (DAPO: 4096 of 20480)
OVERLONG_BUFFER=2048

EBPO_RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ALL_VAL_SETS=(math500 aime2024 aime2025 amc23 olympiadbench)
EBPO_ALGOS="ebpo ebpo_bb ebpo_batch grpo grpo_bn drgrpo dapo entropy_mech rloo reinforce_pp spo bnpo js"

ebpo_die() {
  echo "ebpo recipe: $*" >&2
  exit 2
}

# ebpo_help SCRIPT [SECTION]: the usage = SCRIPT's header comment, then common.sh's switches (SECTION=run)
# or its table-driver section (SECTION=drive). No side effects.
ebpo_help() {
  local script=$1 section=${2:-run} line in_header=1
  while IFS= read -r line; do
    [[ $line == '#!'* ]] && continue
    [[ $line == '#'* ]] || break
    line=${line#\#}
    printf '%s\n' "${line# }"
  done <"$script"
  echo
  if [[ $section == run ]]; then
    echo "Switches (environment variables; recipe/ebpo/common.sh):"
  else
    echo "Table drivers (recipe/ebpo/common.sh):"
  fi
  while IFS= read -r line; do
    if [[ $section == run ]]; then
      [[ $line == '# shellcheck'* ]] && continue
      [[ $line == '#'* ]] || break
    else
      [[ $line == '# ---'* ]] && in_header=0 && continue
      ((in_header)) && continue
      [[ $line == '#'* ]] || break
    fi
    line=${line#\#}
    printf '%s\n' "${line# }"
  done <"$EBPO_RECIPE_DIR/common.sh"
}

# True when any argument asks for help.
ebpo_wants_help() {
  local arg
  for arg in "$@"; do [[ $arg == -h || $arg == --help ]] && return 0; done
  return 1
}

# ebpo_int NAME VALUE MIN [what]: VALUE must be a decimal integer >= MIN.
ebpo_int() {
  if ! [[ $2 =~ ^[0-9]{1,9}$ ]] || ((10#$2 < $3)); then
    ebpo_die "$1=$2 is not an integer >= $3${4:+ ($4)}: set $1 to one"
  fi
}

# ebpo_choice NAME VALUE CHOICE...: VALUE must be one of the choices.
ebpo_choice() {
  local name=$1 value=$2 choice
  shift 2
  for choice in "$@"; do [[ $value == "$choice" ]] && return 0; done
  ebpo_die "unknown $name=$value (one of: $*)"
}

# The authors' schedule (docs/paper_notes.md#authors-runs): validation on AIME24 with 8 samples before
# training and every 5 steps, a checkpoint every 10 steps; `ebpo_paper_schedule 200` also stops the runs at
# global step 200 (the evaluated checkpoint of the main runs), `ebpo_paper_schedule epoch` leaves the length
# to the epoch count. Table drivers call it before registering their experiments; values set in the
# environment win.
ebpo_paper_schedule() {
  EBPO_SCHEDULE_DEFAULTS=([TOTAL_STEPS]="" [TOTAL_EPOCHS]="" [TEST_FREQ]=5 [SAVE_FREQ]=10 [VAL_SETS]=aime2024
    [VAL_N]=8)
  if [[ $1 != epoch ]]; then EBPO_SCHEDULE_DEFAULTS[TOTAL_STEPS]=$1; fi
  TEST_FREQ=${TEST_FREQ:-5}
  SAVE_FREQ=${SAVE_FREQ:-10}
  VAL_SETS=${VAL_SETS:-aime2024}
  VAL_N=${VAL_N:-8}
  if [[ $1 != epoch ]]; then TOTAL_STEPS=${TOTAL_STEPS:-$1}; fi
}

# Defaults of the schedule for a single run, then checks of every switch (one error line, exit 2).
ebpo_schedule_defaults() {
  TOTAL_STEPS=${TOTAL_STEPS:-}
  if [[ -n $TOTAL_STEPS ]]; then
    TOTAL_EPOCHS=${TOTAL_EPOCHS:-$TOTAL_STEPS}
  elif [[ $ORDER == difficulty ]]; then
    TOTAL_EPOCHS=${TOTAL_EPOCHS:-1}
  else
    TOTAL_EPOCHS=${TOTAL_EPOCHS:-3}
  fi
  TEST_FREQ=${TEST_FREQ:-10}
  SAVE_FREQ=${SAVE_FREQ:-10}
  VAL_SETS=${VAL_SETS:-$(IFS=,; echo "${ALL_VAL_SETS[*]}")}
  VAL_N=${VAL_N:-16}
}

# Checks of the switches shared by runs and table drivers; sets VAL_LIST from VAL_SETS.
ebpo_check_shared() {
  local name raw=()
  ebpo_choice REWARD "$REWARD" paper math_verify
  ebpo_choice BASELINES "$BASELINES" paper canonical
  ebpo_int NNODES "$NNODES" 1 "nodes"
  ebpo_int GPUS_PER_NODE "$GPUS_PER_NODE" 1 "GPUs per node"
  ebpo_int KEEP_CKPTS "$KEEP_CKPTS" 1 "checkpoints kept per run"
  ebpo_int VAL_N "$VAL_N" 1 "samples per validation problem"
  [[ -z $TOTAL_STEPS ]] || ebpo_int TOTAL_STEPS "$TOTAL_STEPS" 1 "training steps"
  ebpo_int TOTAL_EPOCHS "$TOTAL_EPOCHS" 1 "passes over the training set"
  for name in TEST_FREQ SAVE_FREQ; do
    [[ ${!name} == -1 ]] || ebpo_int "$name" "${!name}" 1 "steps, or -1 for never"
  done
  IFS=', ' read -ra raw <<<"$VAL_SETS"
  VAL_LIST=()
  for name in "${raw[@]}"; do [[ -z $name ]] || VAL_LIST+=("$name"); done
  ((${#VAL_LIST[@]})) || ebpo_die "VAL_SETS is empty: name at least one of ${ALL_VAL_SETS[*]}"
  for name in "${VAL_LIST[@]}"; do ebpo_choice "VAL_SETS entry" "$name" "${ALL_VAL_SETS[@]}"; done
}

# Checks of a single run's switches.
ebpo_check_run() {
  # shellcheck disable=SC2086  # the list of presets is one word per preset
  ebpo_choice ALGO "$ALGO" $EBPO_ALGOS
  ebpo_choice ORDER "$ORDER" topic naive difficulty random
  ebpo_choice TOPICS "$TOPICS" embed file
  if [[ $ALGO == spo ]]; then
    ebpo_int GROUP_SIZE "$GROUP_SIZE" 1 "responses per prompt"
  else
    ebpo_int GROUP_SIZE "$GROUP_SIZE" 2 "responses per prompt; group baselines need two"
  fi
  ebpo_check_shared
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

# Training reward: the authors' rule (ebpo_verl.paper_reward: verl's DAPO/Minerva `Answer:` rule as their verl
# version ran it, +1/-1, no \boxed{} fallback) or math-verify (ebpo_verl.reward, 1/0).
ebpo_reward_overrides() {
  local fn=reward.custom_reward_function
  case $REWARD in
    paper) OVERRIDES+=("$fn.path=pkg://ebpo_verl.paper_reward" "$fn.name=compute_score") ;;
    math_verify) OVERRIDES+=("$fn.path=pkg://ebpo_verl.reward" "$fn.name=compute_score") ;;
  esac
}

# The estimator / baseline presets. EBPO's rows and GRPO, GRPO+BN, RLOO, SPO, BNPO, JS are the same under
# both BASELINES; Dr.GRPO, DAPO, EntropyMech and REINFORCE++ differ (README.md, "Switches").
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
    rloo) OVERRIDES+=(algorithm.adv_estimator=rloo) ;;
    # the fork's extra baselines (ebpo_verl.baselines): SPO's per-prompt Beta tracker, BNPO, James-Stein
    spo) OVERRIDES+=(algorithm.adv_estimator=spo) ;;
    bnpo) OVERRIDES+=(algorithm.adv_estimator=bnpo) ;;
    js) OVERRIDES+=(algorithm.adv_estimator=shrinkage_js) ;;
    drgrpo | dapo | entropy_mech | reinforce_pp) "ebpo_${BASELINES}_baseline" ;;
  esac
}

# The baselines as the authors ran them (docs/paper_notes.md#authors-runs), on top of the
# shared setup (KL loss 0.001 and token-mean kept unless said otherwise).
ebpo_paper_baseline() {
  local actor=actor_rollout_ref.actor
  case $ALGO in
    # Dr.GRPO: no std division; token-mean and the KL loss kept
    drgrpo) OVERRIDES+=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False) ;;
    # DAPO: clip-higher 0.28 (low 0.2), no std division, KL loss kept. The fork's script also adds
    # filter_groups and an overlong buffer (len 4096, penalty -1.0) that its trainer did not read (no dapo
    # reward manager, no DAPO recipe trainer): off here, as in the run the authors reported.
    dapo)
      OVERRIDES+=(algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False
        "$actor.clip_ratio_high=0.28" algorithm.filter_groups.enable=False)
      ;;
    # EntropyMech: Clip-Cov with PPO's clip opened to [0, 2] (ratios 1.0/1.0), no KL at all. clip_ratio_c=10
    # and kl_ctrl.kl_coef=0 copy the authors' script but are inert in verl 0.9.1 (clip_cov's loss has no
    # dual clip; kl_ctrl is read only with use_kl_in_reward=True)
    entropy_mech)
      OVERRIDES+=(algorithm.adv_estimator=grpo "$actor.policy_loss.loss_mode=clip_cov"
        "$actor.policy_loss.clip_cov_ratio=0.0002" "$actor.policy_loss.clip_cov_lb=1.0"
        "$actor.policy_loss.clip_cov_ub=5.0" "$actor.clip_ratio_low=1.0" "$actor.clip_ratio_high=1.0"
        "$actor.clip_ratio_c=10.0" "$actor.entropy_coeff=0" "$actor.use_kl_loss=False" "$actor.kl_loss_coef=0"
        algorithm.kl_ctrl.kl_coef=0)
      ;;
    reinforce_pp) OVERRIDES+=(algorithm.adv_estimator=reinforce_plus_plus) ;;
  esac
}

# The baselines as their own papers and verl's docs define them.
ebpo_canonical_baseline() {
  local actor=actor_rollout_ref.actor
  case $ALGO in
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
    reinforce_pp) OVERRIDES+=(algorithm.adv_estimator=reinforce_plus_plus_baseline) ;;
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
  local train=$1 name missing=0 sets=(dapo_math "${VAL_LIST[@]}")
  for name in "${sets[@]}"; do [[ -f $DATA_DIR/$name.parquet ]] || missing=1; done
  if ((missing)); then
    ebpo_step "$PYTHON" -m data_prep.all --out-dir "$DATA_DIR" --only "${sets[@]}" \
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
  for val in "${VAL_LIST[@]}"; do val_files+=("$DATA_DIR/$val.parquet"); done
  OVERRIDES+=(
    "data.val_files=$(ebpo_hydra_list "${val_files[@]}")"
    "data.train_batch_size=$TRAIN_BATCH" "data.max_prompt_length=$MAX_PROMPT"
    data.filter_overlong_prompts=True data.truncation=error
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "$actor.optim.lr=1e-6" "$actor.optim.weight_decay=0.01" "$actor.ppo_mini_batch_size=$MINI_BATCH"
    "$actor.use_kl_loss=True" "$actor.kl_loss_coef=0.001" "$actor.kl_loss_type=low_var_kl"
    "$actor.loss_agg_mode=token-mean" "$actor.clip_ratio_low=0.2" "$actor.clip_ratio_high=0.2"
    "$actor.entropy_coeff=0" "$actor.use_dynamic_bsz=True"
    algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.001 # inert without use_kl_in_reward (fidelity)
    "$rollout.name=vllm" "$rollout.n=$GROUP_SIZE" "$rollout.temperature=1.0" "$rollout.top_p=1.0"
    "$rollout.val_kwargs.n=$VAL_N" "$rollout.val_kwargs.temperature=1.0" "$rollout.val_kwargs.top_p=1.0"
    "$rollout.val_kwargs.do_sample=True"
    "trainer.logger=$LOGGERS" "trainer.project_name=$PROJECT" "trainer.experiment_name=$EXPERIMENT"
    "trainer.nnodes=$NNODES" "trainer.n_gpus_per_node=$GPUS_PER_NODE"
    "trainer.default_local_dir=$CKPT_DIR/$EXPERIMENT" "trainer.max_actor_ckpt_to_keep=$KEEP_CKPTS"
    "trainer.metrics_log_path=$LOG_DIR/$EXPERIMENT/metrics.jsonl"
  )
}

ebpo_main() {
  local train
  if ebpo_wants_help "$@"; then
    ebpo_help "$0" run
    return 0
  fi
  : "${MODEL_TAG:?set by the model script}" "${MODEL_PATH:?set by the model script or the environment}"
  ebpo_schedule_defaults
  ebpo_check_run
  EXPERIMENT=${EXPERIMENT:-$MODEL_TAG-$ALGO-g$GROUP_SIZE-$ORDER-rw_$REWARD-bl_$BASELINES}
  OVERRIDES=()
  ebpo_train_file
  train=$TRAIN_PATH
  ebpo_common_overrides
  ebpo_order_overrides
  OVERRIDES+=("data.train_files=$(ebpo_hydra_list "$train")")
  OVERRIDES+=("data.max_response_length=$MAX_RESPONSE" "trainer.total_epochs=$TOTAL_EPOCHS"
    "trainer.test_freq=$TEST_FREQ" "trainer.save_freq=$SAVE_FREQ" trainer.val_before_train=True)
  if [[ -n $TOTAL_STEPS ]]; then OVERRIDES+=("trainer.total_training_steps=$TOTAL_STEPS"); fi
  ebpo_reward_overrides
  ebpo_algo_overrides
  OVERRIDES+=("${MODEL_OVERRIDES[@]}" "$@")

  if [[ ${PRINT_OVERRIDES:-0} == 1 ]]; then
    printf '%s\n' "${OVERRIDES[@]}"
    return 0
  fi
  ebpo_prepare_data "$train"
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    "$PYTHON" -m ebpo_verl.main --cfg job "${OVERRIDES[@]}" || exit
    if [[ -f $train ]]; then
      echo "DRY_RUN: pre-flight passed (our checks, verl's validate_config at $NNODES x $GPUS_PER_NODE GPUs," \
        "steps per epoch of $train); nothing was prepared, written or started" >&2
    else
      echo "DRY_RUN: pre-flight passed (our checks, verl's validate_config at $NNODES x $GPUS_PER_NODE GPUs;" \
        "steps per epoch not checked: $train is not prepared yet); nothing was prepared, written or started" >&2
    fi
    return 0
  fi
  mkdir -p "$LOG_DIR/$EXPERIMENT"
  exec "$PYTHON" -m ebpo_verl.main "${OVERRIDES[@]}"
}

# ---------------------------------------------------------------------------------------------------
# Table drivers (table_*.sh): call ebpo_paper_schedule, register experiments with ebpo_experiment, then call
# ebpo_drive "$@". Defaults: REWARD=paper, BASELINES=paper and the authors' schedule (validation on AIME24
# x 8 before training and every 5 steps, a checkpoint every 10, KEEP_CKPTS=2; main tables stop at step
# 200, the curriculum after one epoch); every switch of the run scripts (run_qwen3_8b.sh --help) can be set
# and is passed on to each run.
#   FINAL_EVAL    1 (default): after training, evaluate the run's last checkpoint with eval.sh
#                 (EVAL_DIR=WORK_DIR/eval/<experiment>) and tabulate that; 0: tabulate the training run's
#                 own validations (LOG_DIR/<experiment>)
#   EVAL_PROTOCOL paper (default) | verl | both: eval.sh's protocol; one table per protocol
#   SELECT        final (default) | best: which validation of a run the table reports (FINAL_EVAL=0)
#   RESULTS_DIR   tables go to RESULTS_DIR/rw_<REWARD>-bl_<BASELINES>/<protocol, or train_val>/<table>.md
#                                                                               default WORK_DIR/results
# `table_X.sh --list` prints the experiments (section, method, experiment, results, command) and exits;
# other arguments are Hydra overrides for every TRAINING run (the evaluation uses its protocol's settings;
# trainer.default_local_dir / experiment_name / metrics_log_path are refused: use CKPT_DIR / LOG_DIR).
# Experiment names: <model>-<algo>-g<G>-<order>-rw_<REWARD>-bl_<BASELINES>, plus -v<hash> when a schedule
# switch differs from the driver's default or Hydra overrides are given (a hash of those settings), so
# another schedule never reuses a run or its results. A finished training run (LOG_DIR/<name>/.done) is not
# run again and an evaluation whose results files exist is not repeated, so drivers share runs (e.g. the
# EBPO rows of the main and ordering tables) and can be restarted after a failure. DRY_RUN=1 (or
# PRINT_OVERRIDES=1) shows each untrained run's pre-flight (or overrides) and the evaluation and table
# commands, and runs, marks and writes nothing else.

EXP_SECTIONS=()
EXP_METHODS=()
EXP_NAMES=()
EXP_SCRIPTS=()
EXP_ENVS=() # each run's VAR=VALUE words, shell-quoted (printf %q): `eval "words=(${EXP_ENVS[i]})"` restores them
declare -A EBPO_SCHEDULE_DEFAULTS=()
EBPO_SCHEDULE_VARS=(TOTAL_STEPS TOTAL_EPOCHS TEST_FREQ SAVE_FREQ VAL_SETS VAL_N)

# ORDER of a table row: under BASELINES=paper the baselines train on a shuffled stream, as the authors'
# baseline runs did (data.shuffle True); EBPO's rows (and every row under canonical) use topic order.
ebpo_row_order() {
  case $1 in
    ebpo | ebpo_bb | ebpo_batch | grpo_bn) echo topic ;;
    *) if [[ $BASELINES == paper ]]; then echo random; else echo topic; fi ;;
  esac
}

# ebpo_experiment SECTION METHOD MODEL NAME [VAR=VALUE ...]: one training run of run_MODEL.sh, named
# NAME-rw_<REWARD>-bl_<BASELINES> (ebpo_drive appends the variant suffix); the schedule set in the environment
# comes before VAR=VALUE (which win).
ebpo_experiment() {
  local section=$1 method=$2 model=$3 name=$4-rw_$REWARD-bl_$BASELINES var existing words
  shift 4
  [[ -f $EBPO_RECIPE_DIR/run_$model.sh ]] || ebpo_die "no recipe run_$model.sh"
  for existing in "${EXP_NAMES[@]}"; do
    [[ $existing == "$name" ]] && ebpo_die "experiment name used twice: $name"
  done
  words=("MODEL=$model" "REWARD=$REWARD" "BASELINES=$BASELINES")
  for var in "${EBPO_SCHEDULE_VARS[@]}" KEEP_CKPTS; do
    [[ -n ${!var:-} ]] && words+=("$var=${!var}")
  done
  words+=("$@")
  EXP_SECTIONS+=("$section")
  EXP_METHODS+=("$method")
  EXP_NAMES+=("$name")
  EXP_SCRIPTS+=("$model")
  EXP_ENVS+=("$(printf '%q ' "${words[@]}")")
}

# ebpo_variant_suffix [hydra overrides...]: "" on the driver's own schedule without extra overrides, else
# "-v<8 hex digits>", a hash of the schedule settings that differ from the driver's defaults (VAL_SETS
# normalised) and of the overrides, so that e.g. TOTAL_STEPS=100 never reuses the step-200 run or results.
ebpo_variant_suffix() {
  local var value items=() parts=() part
  for var in "${EBPO_SCHEDULE_VARS[@]}"; do
    value=${!var:-}
    if [[ $var == VAL_SETS ]]; then
      IFS=', ' read -ra parts <<<"$value"
      value=""
      for part in "${parts[@]}"; do [[ -z $part ]] || value+=${value:+,}$part; done
    fi
    [[ $value == "${EBPO_SCHEDULE_DEFAULTS[$var]-}" ]] || items+=("$var=$value")
  done
  items+=("$@")
  ((${#items[@]})) || return 0
  printf -- '-v%s' "$(printf '%s\n' "${items[@]}" | sha256sum | cut -c1-8)"
}

# The protocols of the final evaluation, or train_val for the training runs' own validations.
ebpo_protocols() {
  if [[ ${FINAL_EVAL:-1} != 1 ]]; then
    echo train_val
  elif [[ ${EVAL_PROTOCOL:-paper} == both ]]; then
    echo paper verl
  else
    echo "${EVAL_PROTOCOL:-paper}"
  fi
}

# What the table reads for experiment NAME under PROTOCOL: eval.sh's results file or the run's metrics.
ebpo_result_path() {
  if [[ $2 == train_val ]]; then echo "$LOG_DIR/$1"; else echo "$WORK_DIR/eval/$1/results-$2.json"; fi
}

# Refuses the overrides a driver sets itself per run (the evaluation and the tables read those paths).
ebpo_check_driver_overrides() {
  local arg
  for arg in "$@"; do
    if [[ $arg =~ ^\+{0,2}trainer\.(default_local_dir|experiment_name|metrics_log_path)= ]]; then
      ebpo_die "a table driver sets trainer.${BASH_REMATCH[1]} per run (evaluation and tables read it): drop $arg and set CKPT_DIR / LOG_DIR instead"
    fi
  done
}

# ebpo_drive TABLE [--list | hydra overrides...]. Under DRY_RUN=1 / PRINT_OVERRIDES=1 it only shows what it
# would do: each untrained run's pre-flight / overrides, the evaluation and the table commands; it creates no
# marker and runs no evaluation or table.
ebpo_drive() {
  local table=$1 i name failed=() protocol protocols paths done_eval dry=0 suffix words=()
  shift
  if ebpo_wants_help "$@"; then
    ebpo_help "$0" drive
    return 0
  fi
  ebpo_check_driver_overrides "$@"
  [[ ${1:-} == --list ]] && suffix=$(ebpo_variant_suffix "${@:2}") || suffix=$(ebpo_variant_suffix "$@")
  ebpo_schedule_defaults
  ebpo_check_shared
  ebpo_choice FINAL_EVAL "${FINAL_EVAL:-1}" 0 1
  ebpo_choice EVAL_PROTOCOL "${EVAL_PROTOCOL:-paper}" paper verl both
  ebpo_choice SELECT "${SELECT:-final}" final best
  for i in "${!EXP_NAMES[@]}"; do EXP_NAMES[i]+=$suffix; done
  read -ra protocols <<<"$(ebpo_protocols)"
  local results=${RESULTS_DIR:-$WORK_DIR/results}/rw_$REWARD-bl_$BASELINES
  if [[ ${1:-} == --list ]]; then
    printf 'section\tmethod\texperiment\tresults\tcommand\n'
    for i in "${!EXP_NAMES[@]}"; do
      paths=()
      for protocol in "${protocols[@]}"; do paths+=("$(ebpo_result_path "${EXP_NAMES[i]}" "$protocol")"); done
      printf '%s\t%s\t%s\t%s\t%s\n' "${EXP_SECTIONS[i]}" "${EXP_METHODS[i]}" "${EXP_NAMES[i]}" \
        "$(IFS=,; echo "${paths[*]}")" \
        "${EXP_ENVS[i]}EXPERIMENT=$(printf %q "${EXP_NAMES[i]}") bash $EBPO_RECIPE_DIR/run_${EXP_SCRIPTS[i]}.sh"
    done
    return 0
  fi
  [[ ${DRY_RUN:-0} == 1 || ${PRINT_OVERRIDES:-0} == 1 ]] && dry=1
  export WORK_DIR DATA_DIR CKPT_DIR LOG_DIR PYTHON
  for i in "${!EXP_NAMES[@]}"; do
    name=${EXP_NAMES[i]}
    eval "words=(${EXP_ENVS[i]})"
    if [[ -f $LOG_DIR/$name/.done ]]; then
      echo "== $name: trained before, not run again" >&2
    elif ((dry)); then
      echo "== $name (dry run): ${EXP_ENVS[i]}" >&2
      env "${words[@]}" EXPERIMENT="$name" bash "$EBPO_RECIPE_DIR/run_${EXP_SCRIPTS[i]}.sh" "$@" ||
        failed+=("$name (pre-flight)")
    else
      echo "== $name: ${EXP_ENVS[i]}" >&2
      if ! env "${words[@]}" EXPERIMENT="$name" bash "$EBPO_RECIPE_DIR/run_${EXP_SCRIPTS[i]}.sh" "$@"; then
        failed+=("$name (training)")
        continue
      fi
      touch "$LOG_DIR/$name/.done"
    fi
    [[ ${FINAL_EVAL:-1} == 1 ]] || continue
    done_eval=1
    for protocol in "${protocols[@]}"; do [[ -f $(ebpo_result_path "$name" "$protocol") ]] || done_eval=0; done
    words=(env "EVAL_PROTOCOL=${EVAL_PROTOCOL:-paper}" "EVAL_DIR=$WORK_DIR/eval/$name" bash
      "$EBPO_RECIPE_DIR/eval.sh" "$CKPT_DIR/$name")
    if ((done_eval)); then
      echo "== $name: evaluated before, not run again" >&2
    elif ((dry)); then
      echo "DRY_RUN: would evaluate: $(printf '%q ' "${words[@]}")" >&2
    elif ! "${words[@]}"; then
      failed+=("$name (evaluation)")
    fi
  done
  for protocol in "${protocols[@]}"; do
    words=("$PYTHON" "$EBPO_RECIPE_DIR/../../scripts/make_tables.py" --table "$table" --select "${SELECT:-final}"
      --out "$results/$protocol")
    for i in "${!EXP_NAMES[@]}"; do
      words+=("${EXP_SECTIONS[i]}/${EXP_METHODS[i]}=$(ebpo_result_path "${EXP_NAMES[i]}" "$protocol")")
    done
    if ((dry)); then
      echo "DRY_RUN: would tabulate: $(printf '%q ' "${words[@]}")" >&2
    else
      "${words[@]}" || failed+=("tables ($protocol)")
    fi
  done
  if ((${#failed[@]})); then
    ebpo_die "failed (their cells are empty): ${failed[*]}"
  fi
}
