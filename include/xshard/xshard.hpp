#pragma once
/// \file
/// Everything xshard offers, in one include: every capability header below, and through them
/// every public header. A program that includes only the capabilities it uses compiles
/// faster:
///
/// | header                      | provides                                                    |
/// | --------------------------- | ----------------------------------------------------------- |
/// | `xshard/core.hpp`           | MPI environment, collectives, errors; mesh, layouts         |
/// | `xshard/tensor.hpp`         | distributed tensors, distribute / gather, redistribution    |
/// | `xshard/ops.hpp`            | operators with sharding rules, `shard()`                    |
/// | `xshard/nn.hpp`             | tensor-parallel layers                                      |
/// | `xshard/conv.hpp`           | convolutional layers, spatial parallelism (oneDNN)          |
/// | `xshard/train.hpp`          | parameters, gradient sync, `hsdp`, optimizers, schedules    |
/// | `xshard/data.hpp`           | datasets, views, the mesh loader, readers                   |
/// | `xshard/pipeline.hpp`       | pipeline parallelism                                        |
/// | `xshard/io.hpp`             | checkpoints, safetensors, strategy files                    |
/// | `xshard/search.hpp`         | cost model, calibration, strategy search and propagation    |
/// | `xshard/auto_parallel.hpp`  | MindSpore's `AutoParallel` and the training driver          |
/// | `xshard/graph.hpp`          | programs: traced graphs, autodiff, compiled onto a mesh     |
/// | `xshard/models.hpp`         | ResNet, the transformer block and ResNet as programs        |

#include <xshard/auto_parallel.hpp>
#include <xshard/compiled.hpp>
#include <xshard/conv.hpp>
#include <xshard/core.hpp>
#include <xshard/data.hpp>
#include <xshard/graph.hpp>
#include <xshard/io.hpp>
#include <xshard/models.hpp>
#include <xshard/nn.hpp>
#include <xshard/ops.hpp>
#include <xshard/pipeline.hpp>
#include <xshard/search.hpp>
#include <xshard/tensor.hpp>
#include <xshard/train.hpp>
#include <xshard/version.hpp>
