# A Coder template in the shape of Coder's upstream Kubernetes template (examples/templates/kubernetes/main.tf at
# v2.36.0), as the write-up ran it on kind (../shared/seeds/001_*.txt), for tests/test_coder_kind.py and
# bench/coder_kind_handoff.py. Written here, not copied. What is the same: the home PersistentVolumeClaim has no
# count, so a stop build leaves it; the Deployment has `count = data.coder_workspace.me.start_count`, so a stop
# build deletes it; `wait_for_rollout = false`, so a start build ends once the Deployment is made, whether its
# pod gets a GPU or waits; the objects carry the upstream labels (com.coder.workspace.id among them, by which the
# culler pairs a workspace with its pod); strategy Recreate; home at /home/coder; uid 1000.
#
# What differs, and why:
# - One nvidia.com/gpu requested (the write-up's change; the node advertises one fake GPU).
# - The image is a local one given by the template admin (`var.image`, imagePullPolicy Never): nothing is pulled.
# - The container does not run the agent's init script: it downloads the agent binary from Coder's access URL,
#   and the Coder built here leaves out the web UI and the agent binaries it would serve (hack/coder/build.sh),
#   nor has the local image curl or wget. The container sleeps instead (exiting at once on SIGTERM, as the agent
#   does), with the agent's token in its environment as upstream gives it. Coder thus sees no agent connect.
# - Small CPU and memory requests, and no cpu/memory/disk parameters: one kind node runs it all.
# - The kubeconfig and the namespace are the template admin's variables (upstream: `use_kubeconfig`, `namespace`).
terraform {
  required_providers {
    coder = {
      source = "coder/coder"
    }
    kubernetes = {
      source = "hashicorp/kubernetes"
    }
  }
}

variable "kubeconfig" {
  type        = string
  description = "Path of the kubeconfig Terraform uses to reach the cluster"
}

variable "namespace" {
  type        = string
  description = "The namespace the workspaces are made in"
}

variable "image" {
  type        = string
  description = "The workspace image, already on the nodes"
}

provider "coder" {}

provider "kubernetes" {
  config_path = var.kubeconfig
}

data "coder_provisioner" "me" {}
data "coder_workspace" "me" {}
data "coder_workspace_owner" "me" {}

resource "coder_agent" "main" {
  os   = "linux"
  arch = data.coder_provisioner.me.arch
  dir  = "/home/coder"
}

locals {
  name = "coder-${lower(data.coder_workspace_owner.me.name)}-${lower(data.coder_workspace.me.name)}"
  labels = {
    "app.kubernetes.io/part-of" = "coder"
    "com.coder.resource"        = "true"
    "com.coder.workspace.id"    = data.coder_workspace.me.id
    "com.coder.workspace.name"  = data.coder_workspace.me.name
    "com.coder.user.id"         = data.coder_workspace_owner.me.id
    "com.coder.user.username"   = data.coder_workspace_owner.me.name
  }
}

resource "kubernetes_persistent_volume_claim" "home" {
  metadata {
    name      = "${local.name}-home"
    namespace = var.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "coder-pvc" })
    annotations = {
      "com.coder.user.email" = data.coder_workspace_owner.me.email
    }
  }
  wait_until_bound = false
  spec {
    access_modes = ["ReadWriteOnce"]
    resources {
      requests = {
        storage = "1Gi"
      }
    }
  }
}

resource "kubernetes_deployment" "main" {
  count            = data.coder_workspace.me.start_count
  depends_on       = [kubernetes_persistent_volume_claim.home]
  wait_for_rollout = false
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = merge(local.labels, { "app.kubernetes.io/name" = "coder-workspace" })
  }
  spec {
    replicas = 1
    selector {
      match_labels = {
        "app.kubernetes.io/name" = "coder-workspace"
        "com.coder.workspace.id" = data.coder_workspace.me.id
      }
    }
    strategy {
      type = "Recreate"
    }
    template {
      metadata {
        labels = merge(local.labels, { "app.kubernetes.io/name" = "coder-workspace" })
      }
      spec {
        security_context {
          run_as_user     = 1000
          fs_group        = 1000
          run_as_non_root = true
        }
        container {
          name              = "dev"
          image             = var.image
          image_pull_policy = "Never"
          command           = ["sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"]
          env {
            name  = "CODER_AGENT_TOKEN"
            value = coder_agent.main.token
          }
          resources {
            requests = {
              cpu              = "50m"
              memory           = "64Mi"
              "nvidia.com/gpu" = "1"
            }
            limits = {
              "nvidia.com/gpu" = "1"
            }
          }
          volume_mount {
            mount_path = "/home/coder"
            name       = "home"
          }
        }
        volume {
          name = "home"
          persistent_volume_claim {
            claim_name = kubernetes_persistent_volume_claim.home.metadata[0].name
          }
        }
      }
    }
  }
}
