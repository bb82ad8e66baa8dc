#pragma once
/// \file
/// Ready networks: ResNet, and the MLP and GPT-style decoder whose per-operator strategies
/// the search sets at run time, with their operators.

#include <xshard/auto/searched_mlp.hpp>
#include <xshard/auto/searched_ops.hpp>
#include <xshard/auto/searched_transformer.hpp>
#include <xshard/nn/resnet.hpp>
