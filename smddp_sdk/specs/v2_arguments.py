"""Every SageMaker SDK v2 ``PyTorch``/``Framework``/``EstimatorBase`` argument and estimator method, and
what this project does with it: accepted (a ``JobSpec`` field, same meaning), emulated (taken and mapped
onto something of ours), or refused with the reason and what to use instead.

The estimator reads these tables; ``tests/sagemaker/test_v2_surface.py`` checks them against the real v2
SDK (the oracle), so a v2 argument or method can never be silently missing. Stdlib only.
"""

from __future__ import annotations

# Arguments the estimator takes and turns into something else (not JobSpec fields).
EMULATED_ARGUMENTS: dict[str, str] = {
    "sagemaker_session": "its region and boto3 session become the sagemaker scheduler's options; a LocalSession changes nothing",
}

# Arguments with no equivalent here: the reason and what to do instead.
REFUSED_ARGUMENTS: dict[str, str] = {
    "instance_groups": "heterogeneous clusters are not offered; use instance_type and instance_count",
    "rules": "SageMaker Debugger rules are not offered",
    "profiler_config": "the SageMaker profiler is not offered; disable_profiler=True is accepted",
    "tensorboard_output_config": "TensorBoard output sync is not offered; write event files to SM_OUTPUT_DATA_DIR",
    "git_config": "clone the repository yourself and pass its directory as source_dir",
    "model_uri": "pass the model as an input channel instead: fit(inputs={'model': <location>})",
    "model_channel_name": "pass the model as an input channel instead: fit(inputs={'model': <location>})",
    "compiler_config": "SageMaker Training Compiler is not offered",
    "training_recipe": "HyperPod recipes are not offered; use entry_point",
    "recipe_overrides": "HyperPod recipes are not offered; use entry_point",
    "container_entry_point": "the container runs the smddp runtime (`train`); use entry_point and hyperparameters",
    "container_arguments": "the container runs the smddp runtime (`train`); use entry_point and hyperparameters",
    "enable_remote_debug": "remote debugging is not offered",
    "enable_session_tag_chaining": "session tag chaining is not offered",
    "training_plan": "SageMaker training plans are not offered",
    "instance_placement_config": "instance placement is not offered",
    "enable_infra_check": "infrastructure checks are not offered",
    "training_repository_access_mode": "private image registries are not offered; push the image to ECR",
    "training_repository_credentials_provider_arn": "private image registries are not offered; push the image to ECR",
    "volume_kms_key": "KMS keys are not offered yet; use the bucket's default encryption",
    "output_kms_key": "KMS keys are not offered yet; use the bucket's default encryption",
}

# v2 estimator methods and properties this project implements.
OFFERED_METHODS: tuple[str, ...] = (
    "attach", "fit", "logs", "hyperparameters", "set_hyperparameters", "model_data", "training_image_uri",
    "enable_network_isolation", "get_vpc_config", "training_job_analytics",
)

# v2 estimator methods with no equivalent here: the reason and what to do instead.
REFUSED_METHODS: dict[str, str] = {
    "deploy": "hosting is not offered; load model_data (model.tar.gz) in your own serving stack or deploy it with the SageMaker SDK",
    "create_model": "hosting is not offered; build a model from model_data with the SageMaker SDK",
    "compile_model": "SageMaker Neo compilation is not offered",
    "register": "the SageMaker model registry is not offered; register model_data with the SageMaker SDK",
    "transformer": "batch transform is not offered; run inference as a training job or with the SageMaker SDK",
    "delete_endpoint": "hosting is not offered, so there is no endpoint to delete",
    "latest_job_debugger_artifacts_path": "SageMaker Debugger is not offered",
    "latest_job_profiler_artifacts_path": "the SageMaker profiler is not offered",
    "latest_job_tensorboard_artifacts_path": "TensorBoard output sync is not offered; read event files from the job's output",
    "enable_default_profiling": "the SageMaker profiler is not offered",
    "disable_profiling": "the SageMaker profiler is not offered (it is always off)",
    "update_profiler": "the SageMaker profiler is not offered",
    "enable_remote_debug": "remote debugging is not offered",
    "disable_remote_debug": "remote debugging is not offered",
    "get_remote_debug_config": "remote debugging is not offered",
    "get_session_chaining_config": "session tag chaining is not offered",
    "get_app_url": "SageMaker Studio apps are not offered; use `smddp-launch logs` and `smddp-launch metrics`",
    "prepare_workflow_for_training": "SageMaker Pipelines are not offered; run fit() or `smddp-launch`",
}

# Class constants v2's PyTorch carries for its own container plumbing (not user-facing behaviour).
V2_CONSTANTS_NOT_EXPOSED = "upper-case class constants (environment variable names of v2's containers)"

__all__ = ["EMULATED_ARGUMENTS", "REFUSED_ARGUMENTS", "OFFERED_METHODS", "REFUSED_METHODS", "V2_CONSTANTS_NOT_EXPOSED"]
