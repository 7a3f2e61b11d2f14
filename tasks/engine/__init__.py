"""llama.cpp as this project builds and runs it: the pinned llama-cpp-python build and its
server (llama_build.py) and the runtime helpers around the library
(llama_cpp.py)."""
