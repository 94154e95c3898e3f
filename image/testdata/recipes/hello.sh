#!/bin/sh
echo "hello from the image"
