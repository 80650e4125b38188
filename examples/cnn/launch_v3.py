"""The CNN example as a SageMaker SDK v3 launcher: only its import lines differ from one written for
``sagemaker.train`` (each says what it was).

SMDDP_SCHEDULER=local python examples/cnn/launch_v3.py     # 2 simulated hosts x 2 ranks here, no Docker or AWS
python examples/cnn/launch_v3.py                           # as v3 would: a SageMaker training job

SMDDP runs through Torchrun as AWS documents it for v3: train.py calls dist.init_process_group("smddp").
"""

from pathlib import Path

from smddp_sdk.train import ModelTrainer  # was: from sagemaker.train import ModelTrainer
from smddp_sdk.train.configs import Compute, MetricDefinition, SourceCode, StoppingCondition  # was: from sagemaker.train.configs import ...
from smddp_sdk.train.distributed import Torchrun  # was: from sagemaker.train.distributed import Torchrun

HERE = Path(__file__).resolve().parent

trainer = ModelTrainer(
    training_image="123456789012.dkr.ecr.us-west-2.amazonaws.com/smddp-sdk:latest",  # your ECR copy of the image
    source_code=SourceCode(source_dir=str(HERE), entry_script="train.py"),
    compute=Compute(instance_type="ml.g5.12xlarge", instance_count=2),
    distributed=Torchrun(process_count_per_node=2),
    stopping_condition=StoppingCondition(max_runtime_in_seconds=1800),
    hyperparameters={"epochs": 2, "batch-size": 64, "samples": 2048},
    base_job_name="cnn-example-v3",
).with_metric_definitions([MetricDefinition(name="loss", regex="loss ([0-9.]+)")])
trainer.train()
print(f"model: {trainer.model_data}")
