#!/usr/bin/env bash
# Push a locally built image to Amazon ECR so SageMaker can run it (image_uri=...).
#
#   scripts/push-ecr.sh [--image smddp-sdk:0.1.0] [--repository smddp-sdk] [--tag 0.1.0] [--region us-west-2]
#
# Creates the repository when it does not exist, logs docker in with a token from ECR, tags and pushes,
# and prints the pushed image URI on stdout (progress goes to stderr). Uses the aws CLI when present,
# boto3 otherwise (pip install 'smddp-sdk[aws]'); credentials and region come from the usual AWS
# sources (environment, ~/.aws, instance role). Options fall back to SMDDP_IMAGE, SMDDP_ECR_REPOSITORY,
# AWS_REGION / AWS_DEFAULT_REGION.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(python3 -c 'import re; print(re.search(r"^version = \"([^\"]+)\"", open("pyproject.toml").read(), re.M).group(1))')
IMAGE=${SMDDP_IMAGE:-smddp-sdk:$VERSION}
REPOSITORY=${SMDDP_ECR_REPOSITORY:-smddp-sdk}
TAG=""
REGION=${AWS_REGION:-${AWS_DEFAULT_REGION:-}}

while [[ $# -gt 0 ]]; do
  case $1 in
    --image) IMAGE=$2; shift 2 ;;
    --repository) REPOSITORY=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --region) REGION=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "push-ecr: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $TAG ]] || TAG=${IMAGE##*:}
[[ $TAG != "$IMAGE" ]] || TAG=latest

say() { echo "==> $*" >&2; }
die() { echo "push-ecr: error: $1" >&2; exit "${2:-1}"; }

docker info >/dev/null 2>&1 || die "no Docker engine answers; start one with: eval \"\$(scripts/docker-engine.sh start)\"" 3
docker image inspect "$IMAGE" >/dev/null 2>&1 || die "image $IMAGE not found; build it with: scripts/build-image.sh --tag $IMAGE"

# One small helper per AWS call, each through the aws CLI or boto3, whichever is installed.
if command -v aws >/dev/null; then
  aws_region() { aws configure get region || true; }
  aws_account() { aws sts get-caller-identity --query Account --output text; }
  aws_ensure_repository() {
    aws ecr describe-repositories --region "$REGION" --repository-names "$REPOSITORY" >/dev/null 2>&1 ||
      aws ecr create-repository --region "$REGION" --repository-name "$REPOSITORY" >/dev/null
  }
  aws_login_password() { aws ecr get-login-password --region "$REGION"; }
else
  python3 -c 'import boto3' 2>/dev/null || die "neither the aws CLI nor boto3 is installed; pip install boto3 (or awscli)" 3
  aws_region() { python3 -c 'import boto3; print(boto3.session.Session().region_name or "")'; }
  aws_account() { python3 -c 'import boto3; print(boto3.client("sts").get_caller_identity()["Account"])'; }
  aws_ensure_repository() {
    python3 - "$REGION" "$REPOSITORY" <<'PY'
import sys, boto3
region, name = sys.argv[1:]
ecr = boto3.client("ecr", region_name=region)
try:
    ecr.describe_repositories(repositoryNames=[name])
except ecr.exceptions.RepositoryNotFoundException:
    ecr.create_repository(repositoryName=name)
PY
  }
  aws_login_password() {
    # The token is base64 of "AWS:<password>".
    python3 - "$REGION" <<'PY'
import base64, sys, boto3
data = boto3.client("ecr", region_name=sys.argv[1]).get_authorization_token()["authorizationData"][0]
print(base64.b64decode(data["authorizationToken"]).decode().split(":", 1)[1])
PY
  }
fi

[[ -n $REGION ]] || REGION=$(aws_region)
[[ -n $REGION ]] || die "no AWS region; pass --region or set AWS_REGION" 2
ACCOUNT=$(aws_account) || die "cannot read the AWS account; check your credentials (aws sts get-caller-identity)" 3
REGISTRY="$ACCOUNT.dkr.ecr.$REGION.amazonaws.com"
URI="$REGISTRY/$REPOSITORY:$TAG"

say "ensuring ECR repository $REPOSITORY in $REGION"
aws_ensure_repository
say "logging docker in to $REGISTRY"
aws_login_password | docker login --username AWS --password-stdin "$REGISTRY" >/dev/null
say "pushing $IMAGE as $URI"
docker tag "$IMAGE" "$URI"
docker push "$URI" >&2
say "pushed; train with PyTorch(..., image_uri=\"$URI\") or image_uri: $URI in job.yaml"
echo "$URI"
