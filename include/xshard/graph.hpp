#pragma once
/// \file
/// Programs: a user's network traced into an operator graph, differentiated, compiled onto a
/// mesh and run (graph/trace.hpp, graph/executable.hpp).

#include <xshard/graph/custom.hpp>
#include <xshard/graph/executable.hpp>
#include <xshard/graph/layouts.hpp>
#include <xshard/graph/primitive.hpp>
#include <xshard/graph/primitives/conv.hpp>
#include <xshard/graph/primitives/elementwise.hpp>
#include <xshard/graph/primitives/embedding.hpp>
#include <xshard/graph/primitives/matmul.hpp>
#include <xshard/graph/primitives/normalize.hpp>
#include <xshard/graph/primitives/reduce.hpp>
#include <xshard/graph/primitives/shape.hpp>
#include <xshard/graph/profile.hpp>
#include <xshard/graph/program.hpp>
#include <xshard/graph/program_chain.hpp>
#include <xshard/graph/registry.hpp>
#include <xshard/graph/schedule.hpp>
#include <xshard/graph/split.hpp>
#include <xshard/graph/trace.hpp>
#include <xshard/ops/conv.hpp>
#include <xshard/ops/elementwise.hpp>
#include <xshard/ops/embedding.hpp>
#include <xshard/ops/matmul.hpp>
#include <xshard/ops/normalize.hpp>
#include <xshard/ops/reduce.hpp>
#include <xshard/ops/shape.hpp>
