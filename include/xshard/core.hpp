#pragma once
/// \file
/// The base every xshard program includes: the MPI environment, communicators, typed
/// collectives, error agreement and watched waits (comm/), and the device mesh, layouts,
/// strategies and block partition arithmetic (core/). No xtensor: a program that only needs a mesh and its
/// sub-communicators stops here.

#include <xshard/comm/agree.hpp>
#include <xshard/comm/before_finalize.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/combine.hpp>
#include <xshard/comm/communicator.hpp>
#include <xshard/comm/counting_allocator.hpp>
#include <xshard/comm/datatype.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/error.hpp>
#include <xshard/comm/float16.hpp>
#include <xshard/comm/heap.hpp>
#include <xshard/comm/node.hpp>
#include <xshard/comm/node_arena.hpp>
#include <xshard/comm/node_barrier.hpp>
#include <xshard/comm/node_reduce.hpp>
#include <xshard/comm/node_slots.hpp>
#include <xshard/comm/pairwise_reduce.hpp>
#include <xshard/comm/reduction.hpp>
#include <xshard/comm/report_errors.hpp>
#include <xshard/comm/request.hpp>
#include <xshard/comm/shared_window.hpp>
#include <xshard/comm/subarray.hpp>
#include <xshard/comm/watch.hpp>
#include <xshard/core/annotation.hpp>
#include <xshard/core/axis.hpp>
#include <xshard/core/elementwise_rule.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/node_shared.hpp>
#include <xshard/core/objective.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/core/parallel_degrees.hpp>
#include <xshard/core/partition.hpp>
#include <xshard/core/rule.hpp>
#include <xshard/core/sharded_layout.hpp>
#include <xshard/core/static_vector.hpp>
#include <xshard/core/strategy.hpp>
#include <xshard/core/volume.hpp>
