#pragma once
/// \file
/// Distributed tensors and redistribution: `dtensor`, `distribute` / `from_local` / `gather`,
/// lazy elementwise expressions and `visualize` (tensor/), and `redistribute<To>(t)` with its
/// plans, batched and cross-mesh redistribution and halo steps (redistribute/).

#include <xshard/redistribute/batch.hpp>
#include <xshard/redistribute/copy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/cross_mesh.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/halo.hpp>
#include <xshard/redistribute/meter.hpp>
#include <xshard/redistribute/node_step.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/redistribute/region_exchange.hpp>
#include <xshard/redistribute/region_message.hpp>
#include <xshard/redistribute/route.hpp>
#include <xshard/redistribute/traffic.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/tensor/expression.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/tensor/visualize.hpp>
