#pragma once
/// \file
/// Everything xshard offers, in one include.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/plan.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/redistribute.hpp>
#include <xshard/redistribute/reduce.hpp>
#include <xshard/tensor/distribute.hpp>
#include <xshard/tensor/dtensor.hpp>
#include <xshard/tensor/expression.hpp>
#include <xshard/tensor/gather.hpp>
#include <xshard/tensor/visualize.hpp>
