"""privalign.mechanisms"""
