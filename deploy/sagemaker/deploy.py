"""Deploy the Outpost image as a SageMaker real-time endpoint on Graviton (arm64). A recipe: it has
not been run from the build machines (no AWS account or network there) and is not tested.

Prerequisites: the image built for arm64 (`make image` on a Graviton host, or `docker buildx build
--platform linux/arm64 -f deploy/Dockerfile .`) and pushed to ECR; the GGUF uploaded uncompressed to
an S3 prefix (SageMaker copies it to /opt/ml/model, where `IMAGE serve` finds it); an execution role
that can read both. Then:

    pip install boto3
    python deploy/sagemaker/deploy.py --image 123456789012.dkr.ecr.us-east-1.amazonaws.com/outpost:0.1.0 \\
        --model-s3 s3://my-bucket/models/smollm2-135m/ --role arn:aws:iam::123456789012:role/SageMakerExec \\
        --name outpost-smollm2 --instance-type ml.c7g.xlarge
    python deploy/sagemaker/deploy.py --name outpost-smollm2 --invoke "What is a GGUF file?"
    python deploy/sagemaker/deploy.py --name outpost-smollm2 --delete

Instance types (arm64, Graviton3): ml.c7g.large|xlarge|2xlarge|4xlarge... (compute), ml.m7g.* (more
memory per vCPU), ml.r7g.*; Graviton2: ml.c6g.*, ml.m6g.*. Threads default to the instance's vCPUs.
Every outpost flag can be passed as an environment variable (OUTPOST_PARALLEL, OUTPOST_CTX_SIZE, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _client(service: str, region: str | None) -> Any:
    import boto3  # not an Outpost dependency: only this recipe needs it

    return boto3.client(service, region_name=region)


def create(args: argparse.Namespace) -> None:
    sm = _client("sagemaker", args.region)
    env = {"OUTPOST_PARALLEL": str(args.parallel)}
    sm.create_model(
        ModelName=args.name,
        ExecutionRoleArn=args.role,
        PrimaryContainer={
            "Image": args.image,
            # An uncompressed S3 prefix: SageMaker copies its files to /opt/ml/model as they are.
            "ModelDataSource": {
                "S3DataSource": {
                    "S3Uri": args.model_s3,
                    "S3DataType": "S3Prefix",
                    "CompressionType": "None",
                }
            },
            "Environment": env,
        },
    )
    sm.create_endpoint_config(
        EndpointConfigName=args.name,
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": args.name,
                "InstanceType": args.instance_type,
                "InitialInstanceCount": args.count,
                # /ping turns 200 once the model is loaded; a 135M-1.7B GGUF loads in seconds.
                "ContainerStartupHealthCheckTimeoutInSeconds": 600,
            }
        ],
    )
    sm.create_endpoint(EndpointName=args.name, EndpointConfigName=args.name)
    print(f"creating endpoint {args.name}; waiting until InService ...", file=sys.stderr)
    sm.get_waiter("endpoint_in_service").wait(EndpointName=args.name)
    print(args.name)


def invoke(args: argparse.Namespace) -> None:
    rt = _client("sagemaker-runtime", args.region)
    body = {"inputs": args.invoke, "parameters": {"max_new_tokens": 128}}  # TGI's body
    r = rt.invoke_endpoint(
        EndpointName=args.name,
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps(body),
    )
    print(json.loads(r["Body"].read())[0]["generated_text"])


def delete(args: argparse.Namespace) -> None:
    sm = _client("sagemaker", args.region)
    sm.delete_endpoint(EndpointName=args.name)
    sm.delete_endpoint_config(EndpointConfigName=args.name)
    sm.delete_model(ModelName=args.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="model, endpoint config and endpoint name")
    p.add_argument("--region")
    p.add_argument("--image", help="the arm64 image in ECR")
    p.add_argument("--model-s3", help="S3 prefix holding one .gguf (uncompressed)")
    p.add_argument("--role", help="SageMaker execution role ARN")
    p.add_argument("--instance-type", default="ml.c7g.xlarge")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--parallel", type=int, default=4, help="slots (OUTPOST_PARALLEL)")
    p.add_argument("--invoke", metavar="PROMPT", help="send one TGI request to the endpoint")
    p.add_argument("--delete", action="store_true", help="delete endpoint, config and model")
    args = p.parse_args()
    if args.delete:
        delete(args)
    elif args.invoke:
        invoke(args)
    else:
        if not (args.image and args.model_s3 and args.role):
            p.error("creating an endpoint needs --image, --model-s3 and --role")
        create(args)


if __name__ == "__main__":
    main()
