"""privalign.service"""
