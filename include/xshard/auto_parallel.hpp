#pragma once
/// \file
/// MindSpore's `AutoParallel` configuration object and the training driver around it
/// (`model`, callbacks), deferred shard-local parameter initialisation and communication-group
/// files.

#include <xshard/auto/auto_parallel.hpp>
#include <xshard/auto/group_file.hpp>
#include <xshard/auto/initializer.hpp>
#include <xshard/auto/model.hpp>
